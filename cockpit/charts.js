/*
 * A pool's charts of the last hour (Debian's libjs-dygraphs): workers, jobs, the oldest
 * job's age.  Each scale decision is a mark on the workers chart and a dotted line across
 * all three; each fire of a schedule serving the pool is a solid line across all three,
 * at its slot's time.  The charts are drawn from a PoolCard's rows, events and fires.
 */

import { $, HOUR, clock, plural, reasonWords, seconds } from "./format.js";

const MIN_SPAN = 5 * 60 * 1000;  // ms: the narrowest time axis a chart gets
const FIRE_COLOR = "#8476d1";

// Dygraphs' own legend writes inline styles, which Cockpit's Content-Security-Policy
// refuses: each chart gets a legend and a hover read-out of the page's own instead.
if (typeof Dygraph !== "undefined" && Dygraph.Plugins && Dygraph.Plugins.Legend)
    Dygraph.PLUGINS = Dygraph.PLUGINS.filter(plugin => plugin !== Dygraph.Plugins.Legend);

// Each chart's series: label, colour, dashed.  The legend says the same in words.
const SERIES = {
    workers: [["active", "#0066cc", false], ["starting", "#5ba352", false], ["draining", "#f0ab00", false], ["desired", "#151515", true]],
    jobs: [["runnable", "#c9190b", false], ["running", "#4cb140", true]],
    age: [["oldest age", "#a30000", false], ["target", "#6a6e73", true]],
};

// An event's time in whole milliseconds: a chart point (a Date) and its annotation must agree.
function eventMs(event) {
    return Math.round(event.at * 1000);
}

function chartData(card) {
    // Decisions become points of the "desired" series, so each can carry its annotation.
    const events = card.sortedEvents();
    const workers = [], jobs = [], age = [];
    const target = card.target;
    let e = 0;
    const pushEvent = event => workers.push([new Date(eventMs(event)), null, null, null, event.desired]);
    for (const r of card.rows) {
        while (e < events.length && eventMs(events[e]) < r.t) pushEvent(events[e++]);
        const t = new Date(r.t);
        workers.push([t, r.active, r.starting, r.draining, r.desired]);
        jobs.push([t, r.runnable, r.running]);
        age.push([t, r.oldest_age, target]);
    }
    while (e < events.length) pushEvent(events[e++]);
    return { workers, jobs, age };
}

function annotations(card) {
    return card.sortedEvents().map(event => ({
        series: "desired",
        x: eventMs(event),
        shortText: event.desired > event.previous ? "▲" : event.desired < event.previous ? "▼" : "•",
        text: clock(event.at) + ": " + event.previous + " → " + event.desired + " workers. " +
            reasonWords(event.reason) + " (" + event.reason + ")." + (event.rationale ? " " + event.rationale : ""),
        cssClass: "decision " + (event.desired > event.previous ? "up" : "down"),
        tickHeight: 6,
    }));
}

function verticals(ctx, area, g, xs, style, dash) {
    ctx.save();
    ctx.strokeStyle = style;
    ctx.lineWidth = dash.length ? 1 : 1.5;
    ctx.setLineDash(dash);
    for (const x of xs) {
        const px = g.toDomXCoord(x);
        if (px < area.x || px > area.x + area.w) continue;
        ctx.beginPath();
        ctx.moveTo(px, area.y);
        ctx.lineTo(px, area.y + area.h);
        ctx.stroke();
    }
    ctx.restore();
}

export function drawCharts(card) {
    if (typeof Dygraph === "undefined") {
        $(".chart-note", card.node).textContent = "The chart library (libjs-dygraphs) is not installed: no charts.";
        return;
    }
    card.dirty = false;
    card.lastDraw = performance.now();
    const data = chartData(card);
    const events = card.sortedEvents();
    // The last hour, or less when there is less: a chart of two minutes in an hour's width says nothing.
    const now = Date.now();
    const first = Math.min(card.rows.length ? card.rows[0].t : now, events.length ? eventMs(events[0]) : now);
    const span = [Math.max(now - HOUR * 1000, Math.min(first, now - MIN_SPAN)), now];
    const marks = events.map(eventMs);
    const fires = card.sortedFires().map(eventMs);
    const underlay = (ctx, area, g) => {
        // Each decision as a thin dotted line across every chart of the pool, each fire of a
        // schedule as a solid one.
        verticals(ctx, area, g, marks, "rgba(90, 90, 90, 0.45)", [2, 3]);
        verticals(ctx, area, g, fires, FIRE_COLOR, []);
    };
    if (!data.workers.length)
        $(".chart-note", card.node).textContent = (card.chartNote ? card.chartNote + " " : "") + "No samples yet.";
    if (!card.charts) card.charts = {};
    for (const name of Object.keys(SERIES)) {
        const figure = $('[data-chart="' + name + '"]', card.node);
        const div = $(".chart", figure);
        const file = data[name];
        if (!file.length) continue;
        if (!card.charts[name]) {
            card.charts[name] = new Dygraph(div, file, chartOptions(name, figure, span, underlay));
        } else {
            card.charts[name].updateOptions({ file, dateWindow: span, underlayCallback: underlay });
        }
        div.setAttribute("aria-label", chartSummary(card, name, file));
        figure.dataset.points = String(file.length);
        figure.dataset.fires = String(fires.filter(x => x >= span[0] && x <= span[1]).length);
        for (const key of figure.querySelectorAll(".fire-key")) key.hidden = !fires.length;
    }
    if (card.charts.workers) card.charts.workers.setAnnotations(annotations(card));
}

function chartOptions(name, figure, span, underlay) {
    const series = SERIES[name];
    const legend = document.createElement("ul");
    legend.className = "legend";
    const item = (color, dashed, label) => {
        const entry = document.createElement("li");
        const swatch = document.createElement("span");
        swatch.className = "swatch";
        swatch.style.borderTopColor = color;
        swatch.style.borderTopStyle = dashed ? "dashed" : "solid";
        entry.append(swatch, label);
        legend.append(entry);
        return entry;
    };
    for (const [label, color, dashed] of series) item(color, dashed, label + (dashed ? " (dashed)" : ""));
    item(FIRE_COLOR, false, "a schedule fired (vertical line)").classList.add("fire-key");
    const readout = document.createElement("p");
    readout.className = "readout subtle";
    readout.textContent = "Hover over the chart for its values.";
    figure.querySelector("figcaption").after(legend);
    figure.append(readout);
    const options = {
        labels: ["time", ...series.map(s => s[0])],
        colors: series.map(s => s[1]),
        series: Object.fromEntries(series.filter(s => s[2]).map(s => [s[0], { strokePattern: [6, 3], strokeWidth: 2 }])),
        dateWindow: span, includeZero: true, connectSeparatedPoints: true, height: 120,
        strokeWidth: 1.5, underlayCallback: underlay, axes: { y: { axisLabelWidth: 40 } },
        highlightCallback: (event, x, points) => {
            const values = points.filter(p => p.yval !== null && !isNaN(p.yval))
                .map(p => p.name + " " + (name === "age" ? seconds(p.yval) : p.yval));
            readout.textContent = clock(x / 1000) + ": " + (values.join(", ") || "no values");
        },
        unhighlightCallback: () => { readout.textContent = "Hover over the chart for its values."; },
    };
    if (name === "workers") {
        options.stepPlot = true;
        // The decision marks: reachable by keyboard too, their reason read out.
        options.drawCallback = g => {
            for (const mark of g.graphDiv.querySelectorAll(".dygraph-annotation")) {
                mark.tabIndex = 0;
                mark.setAttribute("role", "img");
                mark.setAttribute("aria-label", mark.title);
            }
        };
    }
    return options;
}

function chartSummary(card, name, file) {
    const values = i => file.map(row => row[i]).filter(v => v !== null && v !== undefined);
    const range = i => {
        const v = values(i);
        return v.length ? "from " + Math.min(...v) + " to " + Math.max(...v) : "no values";
    };
    const last = i => {
        for (let k = file.length - 1; k >= 0; k--) if (file[k][i] !== null && file[k][i] !== undefined) return file[k][i];
        return "not known";
    };
    const decisions = card.events.size;
    const fires = card.fires.size ? "; " + plural(card.fires.size, "schedule fire", "schedule fires") + " marked" : "";
    if (name === "workers")
        return "Workers of " + card.name + " in the last hour: now " + last(1) + " active, desired " + last(4) +
            "; active " + range(1) + "; " + plural(decisions, "scale decision", "scale decisions") + ", listed below the charts" +
            fires + ".";
    if (name === "jobs")
        return "Runnable jobs of " + card.name + " in the last hour: now " + last(1) + ", " + range(1) +
            "; running now " + last(2) + fires + ".";
    const age = values(1);
    return "Oldest runnable job's age of " + card.name + " in the last hour: now " +
        (typeof last(1) === "number" ? seconds(last(1)) : "not known") +
        (age.length ? ", at most " + seconds(Math.max(...age)) : "") +
        (card.target !== null ? "; target " + seconds(card.target) + "." : ".");
}
