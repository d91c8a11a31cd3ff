/*
 * Words and numbers as the page shows them, and small DOM helpers: no state, no D-Bus.
 */

export const HOUR = 3600;

export const $ = (selector, root) => (root || document).querySelector(selector);

export function text(value) {
    return value === null || value === undefined ? "" : String(value);
}

export function known(value) {
    // D-Bus has no null: flexiqd sends -1 for an unknown count and NaN (null here) for a number.
    return value !== null && value !== undefined && !(typeof value === "number" && (value < 0 || !isFinite(value)));
}

export function seconds(value) {
    if (!known(value)) return "not known";
    if (value < 1) return value.toFixed(2) + " s";
    if (value < 60) return value.toFixed(value < 10 ? 1 : 0) + " s";
    if (value < HOUR) return Math.floor(value / 60) + " min " + Math.round(value % 60) + " s";
    return Math.floor(value / HOUR) + " h " + Math.round((value % HOUR) / 60) + " min";
}

export function clock(epoch) {
    if (!known(epoch)) return "—";
    const date = new Date(epoch * 1000);
    const time = date.toLocaleTimeString([], { hour12: false });
    const today = new Date().toDateString() === date.toDateString();
    return today ? time : date.toLocaleDateString() + " " + time;
}

export function plural(n, one, many) {
    return n + " " + (n === 1 ? one : many);
}

const SIGNAL_WORDS = {
    Age: "the oldest job waited longer than its target",
    Drain: "the backlog would take too long to drain",
    Depth: "jobs per worker",
    Utilisation: "how busy the workers are",
    CPU: "the workers' CPU use",
    FromZero: "jobs arrived and no worker ran",
    Saturation: "the workers are saturated",
    ComingDue: "delayed jobs are coming due",
    SafetyNet: "the oldest job's age passed the safety net",
};

const REASON_WORDS = {
    ScaleFromZero: "Started workers: jobs arrived and no worker ran",
    ScaleDownIdle: "Gave back idle workers: no runnable or running jobs",
    RaisedToMinimum: "Held at the pool's minimum (min_workers)",
    CappedByMax: "Capped at the pool's max_workers",
    CappedByDependency: "Capped by its share of a shared dependency",
    CappedByLatency: "Capped: a dependency's latency is above its max_latency",
    CappedByKnee: "Capped at the knee: more workers stopped adding throughput",
    CappedByProbe: "Capped: a dependency's probe slowed as workers were added",
    CappedByPressure: "Capped: the workers stall on this machine (pressure)",
    StartStaggered: "Starting in steps (start_burst)",
    WaitingForStopping: "Waiting for stopping workers to exit (they still count against the caps)",
    RateLimited: "Held back by the rate limit on changes",
    DesiredWithinRange: "Kept the count: the signals agree with it",
    ScaleUpStabilized: "Held by the up window (stabilisation)",
    ScaleDownStabilized: "Held by the down window (stabilisation)",
    HoldMetricsUnavailable: "Holding: the queue's metrics could not be read",
    Pinned: "Pinned by an operator",
    Paused: "Paused by an operator",
    ScaleUp: "Scaled up",
    ScaleDown: "Scaled down",
    Stable: "Kept the count",
};

export function reasonWords(token) {
    if (!token) return "No decision yet";
    if (REASON_WORDS[token]) return REASON_WORDS[token];
    const match = /^Scale(Up|Down)(.+)$/.exec(token);
    if (match && SIGNAL_WORDS[match[2]]) {
        const direction = match[1] === "Up" ? "Scaled up" : "Scaled down";
        const signal = SIGNAL_WORDS[match[2]];
        return direction + ": " + (["Depth", "Utilisation", "CPU"].includes(match[2]) ? "on " + signal : signal);
    }
    return token;
}

export function capWords(cap, max) {
    if (!cap) return "nothing: no cap limited the last decision";
    const [kind, name] = cap.split(/:(.*)/s);
    if (kind === "max") return "the pool's max_workers (" + max + ")";
    if (kind === "dependency") return "its share of the dependency “" + name + "”";
    if (kind === "latency") return "the latency of the dependency “" + name + "” (max_latency)";
    if (kind === "knee") return "the knee: more workers stopped adding throughput";
    if (kind === "starting") return "how many workers may start at once (start_burst)";
    if (kind === "probe") return "the probe of the dependency “" + name + "”: it slowed as workers were added";
    if (kind === "pressure") return "the workers' " + name + " pressure on this machine";
    return cap;
}

export function ceilingWords(ceiling) {
    if (!ceiling) return "none measured: the pool has not met a ceiling (or an operator cleared it)";
    // A count tried below the best while the knee is trimmed has no rate until it is counted.
    const rate = value => known(value) ? value.toFixed(1) + " jobs/s" : "not measured yet";
    let words = "held at " + ceiling.workers + " workers (" + rate(ceiling.jobs_per_second) + ")";
    if (known(ceiling.since)) words += " since " + clock(ceiling.since);
    if (ceiling.above) {
        words += "; " + ceiling.above.workers + " workers gave " + rate(ceiling.above.jobs_per_second) +
            " at " + clock(ceiling.above.at);
    }
    return words;
}

export function evidenceWords(source) {
    const [kind, name] = source.source.split(/:(.*)/s);
    const probe = kind === "probe";
    const show = value => !known(value) ? "-" : probe ? (1000 * value).toFixed(1) + " ms" : value.toFixed(0) + "%";
    let words = (probe ? "probe of " : "") + name + (probe ? "" : " pressure") + ": ";
    words += source.note ? "no reading (" + source.note + ")" : show(source.reading);
    if (probe) {
        words += known(source.baseline)
            ? " (baseline " + show(source.baseline) + ", holds above " + show(source.bound) + ")"
            : " (no baseline yet: learned while the pool is idle)";
    } else {
        words += " (holds at " + source.threshold + "% and above)";
    }
    if (known(source.held_at)) words += ": held at " + source.held_at + " workers, the count before the rise";
    return words;
}

/* ---------------------------------------------------------------- DOM helpers */

export function cells(row, values) {
    for (const value of values) {
        const cell = document.createElement("td");
        if (value instanceof Node) cell.append(value); else cell.textContent = value;
        row.append(cell);
    }
    return row;
}

export function meter(value, max, label) {
    const m = document.createElement("meter");
    m.min = 0;
    m.max = max;
    m.value = value;
    m.high = max * 0.9;
    m.setAttribute("aria-label", label);
    return m;
}

export function definitionList(pairs) {
    const dl = document.createElement("dl");
    for (const [term, value] of pairs) {
        const dt = document.createElement("dt");
        dt.textContent = term;
        const dd = document.createElement("dd");
        if (value instanceof Node) dd.append(value); else dd.textContent = value;
        dl.append(dt, dd);
    }
    return dl;
}

export function pre(value, label) {
    const block = document.createElement("pre");
    block.textContent = typeof value === "string" ? value : JSON.stringify(value, null, 2);
    block.setAttribute("aria-label", label);
    block.tabIndex = 0;
    return block;
}

export function rowHeader(value) {
    const head = document.createElement("th");
    head.scope = "row";
    if (value instanceof Node) head.append(value); else head.textContent = value;
    return head;
}
