/*
 * The pools: the summary table, one card per pool with its facts and its controls, its
 * last hour (History, then live points from each PropertiesChanged), its scale decisions
 * (ScaleEvent) and the fires of the schedules serving it (schedules.js adds them).
 */

import { $, HOUR, capWords, ceilingWords, clock, evidenceWords, known, plural, reasonWords, seconds, text } from "./format.js";
import { MANAGER, MANAGER_PATH, POOL, call, client, errorText, isMissing } from "./bus.js";
import { emit, on, say, state } from "./page.js";
import { applyControl, confirmAction, denied } from "./steering.js";
import { drawCharts } from "./charts.js";

const CHART_EVERY = 1000;       // ms: a pool's charts redrawn at most this often
const LIVE_STEP = 1000;         // ms: live points closer than this replace the last one

export class PoolCard {
    constructor(name, proxy) {
        this.name = name;
        this.proxy = proxy;
        this.rows = [];           // {t: ms, active, starting, draining, desired, runnable, running, delayed, oldest_age}
        this.events = new Map();  // seq -> event document
        this.fires = new Map();   // schedule + slot -> {at, schedule, kind, job_id}: schedules.js adds them
        this.target = null;       // the age target, from History
        this.chartNote = "";
        this.charts = null;       // the Dygraph objects, made when first visible
        this.visible = false;
        this.dirty = true;
        this.drawTimer = null;
        this.lastDraw = 0;
        this.loaded = false;      // its history is in (or known to be missing)
        this.history = null;      // a promise: its history read (queueHistory)
        this.historyDone = null;

        const node = $("#pool-template").content.firstElementChild.cloneNode(true);
        node.id = "pool-" + name;
        node.dataset.pool = name;
        node.setAttribute("aria-labelledby", "pool-" + name + "-name");
        const heading = $(".pool-name", node);
        heading.id = "pool-" + name + "-name";
        heading.textContent = name;
        $(".steer-note", node).id = "pool-" + name + "-steer-note";
        this.node = node;
        this.summary = document.createElement("tr");
        this.summary.dataset.pool = name;
        this.wireControls();
    }

    get data() {
        return this.proxy ? this.proxy.data || {} : {};
    }

    /* -- the facts */

    render() {
        const d = this.data;
        const node = this.node;
        const active = d.ActiveWorkers, starting = d.StartingWorkers, draining = d.DrainingWorkers;
        const failed = d.FailedWorkers, desired = d.DesiredWorkers;
        const min = d.MinWorkers, max = d.MaxWorkers;
        const sized = known(active);

        $(".f-workers", node).textContent = sized
            ? active + " active, " + starting + " starting, " + draining + " draining, " + failed + " failed; " +
              "desired " + (known(desired) ? desired : "not decided yet") + " (min " + min + ", max " + max + ")"
            : "not sized yet (the pool came with a reload); min " + min + ", max " + max;
        this.renderBar(sized ? active : 0, sized ? starting : 0, sized ? draining : 0, desired, max);

        $(".f-decision .words", node).textContent = reasonWords(d.Reason);
        $(".f-decision .token", node).textContent = d.Reason || "";
        $(".f-decision .rationale", node).textContent = d.Rationale || "";
        const entry = state.status && state.status.pools ? state.status.pools[this.name] : null;
        const capCount = entry && known(entry.binding_cap_workers) && d.BindingCap ? " (" + entry.binding_cap_workers + " workers)" : "";
        $(".f-cap", node).textContent = capWords(d.BindingCap, max) + (d.BindingCap && !d.BindingCap.startsWith("max") ? capCount : "");

        const jobsKnown = known(d.Runnable);
        $(".f-jobs", node).textContent = jobsKnown
            ? d.Runnable + " runnable, " + d.Delayed + " delayed, " + d.Running + " running"
            : "not known: the store could not be read (or not yet)";
        $(".f-age", node).textContent = this.ageText();
        $(".f-age", node).classList.toggle("over", this.overTarget());
        $(".f-drain", node).textContent = this.drainText();
        $(".f-startcost", node).textContent = known(d.StartCost)
            ? seconds(d.StartCost) + " from the decision to the first claim" +
              (known(d.StartCostReady) ? " (systemd's start " + seconds(d.StartCostReady) + ")" : "") +
              ", median of " + plural(d.StartCostSamples, "start", "starts")
            : "not measured yet";
        $(".f-operator", node).textContent = this.operatorText();
        this.renderHeld();
        this.renderCeiling(entry);
        this.renderFlags();
        this.renderSummary();
        this.renderControls();
        for (const queue of d.Queues || []) emit("queue", queue);
    }

    renderBar(active, starting, draining, desired, max) {
        const scale = Math.max(max || 1, desired || 0, active + starting + draining, 1);
        const width = n => (100 * n / scale) + "%";
        $(".seg.active", this.node).style.width = width(active);
        $(".seg.starting", this.node).style.width = width(starting);
        $(".seg.draining", this.node).style.width = width(draining);
        const mark = $(".desired-mark", this.node);
        mark.hidden = !known(desired);
        if (known(desired)) mark.style.left = "calc(" + width(desired) + " - 1px)";
    }

    overTarget() {
        const d = this.data;
        return known(d.OldestRunnableAge) && this.target !== null && d.Runnable > 0 && d.OldestRunnableAge > this.target;
    }

    ageText() {
        const d = this.data;
        const target = this.target !== null ? "target " + seconds(this.target) : "target not known";
        if (!known(d.OldestRunnableAge)) return "not known (no stats) — " + target;
        if (d.Runnable === 0) return "no job waits — " + target;
        return "waited " + seconds(d.OldestRunnableAge) + " — " + target +
            (this.target === null ? "" : this.overTarget() ? ": over its target" : ": within its target");
    }

    drainText() {
        const d = this.data;
        if (known(d.TimeToDrain)) return d.TimeToDrain === 0 ? "nothing waits" : seconds(d.TimeToDrain) + " at the current completion rate";
        if (d.Runnable > 0 && d.CompletionRate === 0) return "never at the current rate: jobs wait and none completes";
        return "not known (no stats)";
    }

    operatorText() {
        const d = this.data;
        const parts = [];
        if (d.Paused) parts.push("Paused: the workers claim no new jobs");
        if (d.Pinned) {
            const until = known(d.PinnedUntil)
                ? "until " + clock(d.PinnedUntil) + " (in " + seconds(Math.max(0, d.PinnedUntil - Date.now() / 1000)) + ")"
                : "until unpinned";
            parts.push((d.PinnedWorkers === 0 ? "Drained: pinned at 0 workers " : "Pinned at " + d.PinnedWorkers + " workers ") + until);
        }
        return parts.length ? parts.join("; ") : "Not paused, not pinned: the policy decides";
    }

    renderCeiling(entry) {
        // Older flexiqd versions send no "ceiling" key: say so rather than "none measured".
        const reported = entry && "ceiling" in entry;
        $(".f-ceiling", this.node).textContent = reported ? ceilingWords(entry.ceiling)
            : state.status ? "not reported by this flexiqd" : "…";
        const sources = reported ? entry.evidence || [] : [];
        $(".f-evidence", this.node).textContent = sources.length
            ? sources.map(evidenceWords).join("; ")
            : "none configured (dependencies.<name>.probe, pools.<pool>.pressure)";
    }

    renderHeld() {
        const entry = state.status && state.status.pools ? state.status.pools[this.name] : null;
        const metrics = entry && entry.metrics;
        const cell = $(".f-held", this.node);
        if (!metrics || metrics.held_by_tenant_cap === undefined) {
            cell.textContent = state.status ? "not reported by this flexiqd" : "…";
            return;
        }
        cell.textContent = metrics.held_by_tenant_cap + " by tenant caps, " +
            text(metrics.waiting_for_dependency) + " waiting for a dependency";
    }

    renderFlags() {
        const d = this.data;
        const flags = $(".flags", this.node);
        flags.replaceChildren();
        const add = (label, kind) => {
            const item = document.createElement("li");
            item.className = "flag " + kind;
            item.textContent = label;
            flags.append(item);
        };
        if (d.Paused) add("Paused", "paused");
        if (d.Pinned) add(d.PinnedWorkers === 0 ? "Drained" : "Pinned at " + d.PinnedWorkers, "pinned");
        if (this.overTarget()) add("Oldest job over target", "over");
        const trouble = this.trouble();
        if (trouble) add(trouble, "over");
        else if (!known(d.Runnable)) add("No stats", "over");
        const restart = this.restartText();
        if (restart) add(restart, restart.startsWith("Restart failed") ? "over" : "pinned");
    }

    /* A deploy's restart (flexiqctl restart): in progress, or failed within the hour. */
    restartText() {
        const entry = state.status && state.status.pools ? state.status.pools[this.name] : null;
        const restart = entry && entry.restart;
        if (!restart) return "";
        if (restart.state === "failed")
            return Date.now() / 1000 - restart.finished_at < HOUR
                ? "Restart failed at " + clock(restart.finished_at) + ": " + restart.error : "";
        if (restart.state === "done") return "";
        if (!known(restart.old_serving)) return "Restarting: the first step at the next tick";
        return "Restarting: " + restart.old_serving + " old serving, " + (restart.old_draining || 0) +
            " old draining, " + restart.new_ready + " new ready" +
            (restart.waiting ? "; " + restart.waiting : "");
    }

    /* What keeps this pool from working, from the Status document: its app cannot be loaded
       by its workers, its workers keep failing, systemd cannot be asked for its workers (the
       bus away: every pool held), the store cannot be read or written. */
    trouble() {
        const entry = state.status && state.status.pools ? state.status.pools[this.name] : null;
        if (!entry) return "";
        if (entry.app_problem) return "Workers cannot run the app: " + entry.app_problem;
        const loop = entry.crash_loop;
        if (loop) return "Crash loop: " + plural(loop.failures, "worker", "workers") + " failed, the last " +
            (loop.last_error || "in a way systemd did not record") + "; next start not before " + clock(loop.next_start_at);
        if (state.status.fleet_problem) return "Held: the workers cannot be listed: " + state.status.fleet_problem;
        if (state.status.store_problem) return "The store takes no writes: " + state.status.store_problem;
        if (entry.stats_error) return "No stats: " + entry.stats_error;
        return "";
    }

    renderSummary() {
        const d = this.data;
        const row = this.summary;
        row.replaceChildren();
        const cell = (value, header) => {
            const c = document.createElement(header ? "th" : "td");
            if (header) c.scope = "row";
            if (value instanceof Node) c.append(value); else c.textContent = value;
            row.append(c);
        };
        const link = document.createElement("a");
        link.href = "#pool-" + this.name;
        link.textContent = this.name;
        cell(link, true);
        cell((known(d.ActiveWorkers) ? d.ActiveWorkers : "—") + " / " + (known(d.DesiredWorkers) ? d.DesiredWorkers : "—"));
        cell(known(d.Runnable) ? String(d.Runnable) : "not known");
        cell(known(d.OldestRunnableAge) && d.Runnable > 0
            ? seconds(d.OldestRunnableAge) + (this.target !== null ? " (" + seconds(this.target) + ")" : "") +
              (this.overTarget() ? " over" : "")
            : "—");
        cell([d.Paused ? "paused" : "", d.Pinned ? "pinned at " + d.PinnedWorkers : ""].filter(Boolean).join(", ") || "—");
        const trouble = this.trouble();
        cell(trouble ? trouble.split(":")[0] : reasonWords(d.Reason));
    }

    /* -- steering */

    wireControls() {
        const form = $(".steer-form", this.node);
        form.addEventListener("submit", event => {
            event.preventDefault();
            const n = Number(form.elements.workers.value);
            const forSeconds = Number(form.elements.for.value);
            this.steer("Scale", [n, forSeconds], "Pinned " + this.name + " at " + n + " workers " +
                (forSeconds > 0 ? "for " + seconds(forSeconds) : "until unpinned") + ".");
        });
        for (const button of form.querySelectorAll("button[data-action]")) {
            const action = button.dataset.action;
            if (action === "pin") continue;
            button.addEventListener("click", () => {
                if (action === "unpin") this.steer("Unpin", [], "Unpinned " + this.name + ": the policy decides again.");
                if (action === "pause") this.steer("Pause", [], "Paused " + this.name + ": its workers claim no new jobs.");
                if (action === "resume") this.steer("Resume", [], "Resumed " + this.name + ".");
                if (action === "drain") {
                    confirmAction("Drain the pool " + this.name + "?",
                        "Every worker of " + this.name + " finishes or releases its jobs and stops, and the pool stays at 0 " +
                        "workers until you unpin it. Queued jobs wait meanwhile.", "Drain " + this.name)
                        .then(ok => ok && this.steer("Drain", [], "Draining " + this.name + ": it stays at 0 until unpinned."));
                }
            });
        }
    }

    steer(method, args, done) {
        return call(method, [this.name, ...args]).then(() => say(done), error => {
            if (!denied(error)) say(method + " " + this.name + ": " + errorText(error), "error");
        });
    }

    renderControls() {
        const d = this.data;
        const form = $(".steer-form", this.node);
        const note = $(".steer-note", this.node);
        note.textContent = state.steer.allowed === false ? state.steer.short : "";
        const input = form.elements.workers;
        if (known(d.MaxWorkers)) input.max = d.MaxWorkers;
        if (input.value === "" && known(d.DesiredWorkers)) input.value = d.DesiredWorkers;
        input.disabled = state.steer.allowed !== true;
        form.elements.for.disabled = state.steer.allowed !== true;
        for (const button of form.querySelectorAll("button[data-action]")) {
            const action = button.dataset.action;
            let off = false, why = "";
            if (action === "unpin" && !d.Pinned) { off = true; why = "The pool is not pinned."; }
            if (action === "pause" && d.Paused) { off = true; why = "The pool is paused already."; }
            if (action === "resume" && !d.Paused) { off = true; why = "The pool is not paused."; }
            applyControl(button, note, off, why);
        }
    }

    /* -- the last hour */

    loadHistory() {
        const since = Date.now() / 1000 - HOUR;
        return call("History", [this.name, since]).then(([json]) => {
            const doc = JSON.parse(json);
            this.target = known(doc.target_age) ? doc.target_age : null;
            const live = this.rows;
            this.rows = doc.samples.map(s => ({ ...s, t: s.t * 1000 }));
            const last = this.rows.length ? this.rows[this.rows.length - 1].t : 0;
            for (const row of live) if (row.t > last) this.rows.push(row);
            for (const event of doc.events || []) this.events.set(event.seq, event);
            this.chartNote = "";
        }, error => {
            this.chartNote = isMissing(error)
                ? "This flexiqd keeps no history on D-Bus (no History method): the charts start when this page opened."
                : "The history could not be read (" + errorText(error) + "): the charts start when this page opened.";
            if (isMissing(error)) return this.loadEventsOnly(since);
        }).then(() => {
            this.loaded = true;
            this.render();
            this.renderDecisions();
            this.scheduleDraw(true);
        });
    }

    loadEventsOnly(since) {
        return call("Events", [0]).then(([json]) => {
            for (const event of JSON.parse(json))
                if (event.pool === this.name && event.at >= since) this.events.set(event.seq, event);
        }, () => {});
    }

    addLiveRow() {
        const d = this.data;
        const value = v => (known(v) ? v : null);
        const row = {
            t: Date.now(), active: value(d.ActiveWorkers), starting: value(d.StartingWorkers),
            draining: value(d.DrainingWorkers), desired: value(d.DesiredWorkers), runnable: value(d.Runnable),
            running: value(d.Running), delayed: value(d.Delayed), oldest_age: value(d.OldestRunnableAge),
        };
        const last = this.rows[this.rows.length - 1];
        if (last && last.live && row.t - last.t < LIVE_STEP) this.rows[this.rows.length - 1] = { ...row, live: true };
        else this.rows.push({ ...row, live: true });
        const horizon = Date.now() - HOUR * 1000;
        while (this.rows.length && this.rows[0].t < horizon) this.rows.shift();
        this.scheduleDraw(false);
    }

    addEvent(event) {
        const had = this.events.get(event.seq);
        this.events.set(event.seq, had && had.rationale ? had : event);
        const horizon = Date.now() / 1000 - HOUR;
        for (const [seq, e] of this.events) if (e.at < horizon) this.events.delete(seq);
        this.renderDecisions();
        this.scheduleDraw(true);
    }

    sortedEvents() {
        return [...this.events.values()].sort((a, b) => a.at - b.at || a.seq - b.seq);
    }

    /* -- the fires of the schedules serving the pool */

    // A fire: {at: its slot (or a run's time), schedule, kind: "slot" | "run", job_id}.
    // Idempotent: the same fire added again changes nothing.
    addFire(fire) {
        const key = fire.schedule + " " + fire.kind + " " + fire.at;
        const horizon = Date.now() / 1000 - HOUR;
        if (this.fires.has(key) || fire.at < horizon) return;
        this.fires.set(key, fire);
        for (const [k, f] of this.fires) if (f.at < horizon) this.fires.delete(k);
        this.renderFires();
        this.scheduleDraw(true);
    }

    sortedFires() {
        return [...this.fires.values()].sort((a, b) => a.at - b.at);
    }

    renderFires() {
        const fires = this.sortedFires();
        const details = $(".fires", this.node);
        details.hidden = !fires.length;
        $("summary", details).textContent = "Schedule fires in the last hour (" + fires.length + ")";
        const body = $("tbody", details);
        body.replaceChildren();
        for (const fire of fires.slice(-50).reverse()) {
            const row = document.createElement("tr");
            for (const value of [clock(fire.at), fire.schedule, fire.kind === "run" ? "run now" : "its slot",
                fire.job_id !== null && fire.job_id !== undefined ? "#" + fire.job_id : "—"]) {
                const cell = document.createElement("td");
                cell.textContent = value;
                row.append(cell);
            }
            body.append(row);
        }
    }

    inView() {
        const box = this.node.getBoundingClientRect();
        return box.top < window.innerHeight && box.bottom > 0;
    }

    renderDecisions() {
        const events = this.sortedEvents();
        $(".decisions summary", this.node).textContent = "Scale decisions in the last hour (" + events.length + ")";
        const body = $(".decisions tbody", this.node);
        body.replaceChildren();
        for (const event of events.slice(-50).reverse()) {
            const row = document.createElement("tr");
            for (const value of [clock(event.at), event.previous + " → " + event.desired,
                reasonWords(event.reason) + " (" + event.reason + ")", event.rationale || ""]) {
                const cell = document.createElement("td");
                cell.textContent = value;
                row.append(cell);
            }
            body.append(row);
        }
        $(".chart-note", this.node).textContent = this.chartNote;
    }

    scheduleDraw(soon) {
        this.dirty = true;
        // No chart before the card's history is in (or known to be missing).
        if (!this.visible || !this.loaded || this.drawTimer !== null) return;
        const wait = soon ? 0 : Math.max(0, CHART_EVERY - (performance.now() - this.lastDraw));
        this.drawTimer = window.setTimeout(() => {
            this.drawTimer = null;
            this.draw();
        }, wait);
    }

    setVisible(visible) {
        this.visible = visible;
        if (visible && this.dirty) this.scheduleDraw(true);
    }

    draw() {
        drawCharts(this);
    }
}

/* ---------------------------------------------------------------- the cards */

const observer = "IntersectionObserver" in window
    ? new IntersectionObserver(entries => {
        for (const entry of entries) {
            const card = state.cards.get(entry.target.dataset.pool);
            if (card) card.setVisible(entry.isIntersecting);
        }
    }, { rootMargin: "300px" })
    : null;

function addCard(name, proxy) {
    let card = state.cards.get(name);
    if (card) {
        card.proxy = proxy;
        card.render();
        return card;
    }
    card = new PoolCard(name, proxy);
    state.cards.set(name, card);
    const names = [...state.cards.keys()].sort();
    const next = names[names.indexOf(name) + 1];
    const nextCard = next ? state.cards.get(next) : null;
    $("#pools").insertBefore(card.node, nextCard ? nextCard.node : null);
    $("#pool-summary tbody").insertBefore(card.summary, nextCard ? nextCard.summary : null);
    $("#no-pools").hidden = true;
    card.render();
    if (observer) observer.observe(card.node); else card.setVisible(true);
    emit("card", card);
    return card;
}

function removeCard(name) {
    const card = state.cards.get(name);
    if (!card) return;
    if (observer) observer.unobserve(card.node);
    card.node.remove();
    card.summary.remove();
    state.cards.delete(name);
    $("#no-pools").hidden = state.cards.size > 0;
}

// Histories are read one after the other, the cards in view first.  An hour of a pool
// is about 100 KB of JSON; many such replies at once have made flexiqd lose its bus
// connection (dbus-fast 1.84 gives up on a full socket: docs/cockpit.md).
const histories = { queue: [], busy: false };

function queueHistory(card, first) {
    if (!card.history) {
        card.history = new Promise(resolve => { card.historyDone = resolve; });
        histories.queue.push(card);
    }
    if (first && histories.queue.includes(card))
        histories.queue = [card, ...histories.queue.filter(c => c !== card)];
    nextHistory();
    return card.history;
}

function nextHistory() {
    if (histories.busy) return;
    const card = histories.queue.shift();
    if (!card) return;
    histories.busy = true;
    card.loadHistory().catch(error => console.warn("history of " + card.name, error)).then(() => {
        histories.busy = false;
        const done = card.historyDone;
        card.historyDone = null;
        if (done) done();
        nextHistory();
    });
}

function reloadHistories() {
    for (const card of state.cards.values()) card.history = null;
    const cards = [...state.cards.values()];
    for (const card of cards.filter(c => c.inView())) queueHistory(card, false);
    for (const card of cards) queueHistory(card, false);
}

function poolName(path) {
    return decodeURIComponent(path.substring(path.lastIndexOf("/") + 1));
}

export function watchPools() {
    const proxies = client.proxies(POOL, MANAGER_PATH);
    proxies.addEventListener("added", (event, proxy) => {
        const card = addCard(proxy.Name || poolName(proxy.path), proxy);
        // At start the pools in view come first (below); later a new pool at once.
        if (state.poolsKnown) queueHistory(card, false);
    });
    proxies.addEventListener("changed", (event, proxy) => {
        const card = state.cards.get(proxy.Name || poolName(proxy.path));
        if (!card) return;
        card.render();
        card.addLiveRow();
        emit("tick", card);
    });
    proxies.addEventListener("removed", (event, proxy) => removeCard(proxy.Name || poolName(proxy.path)));
    return proxies.wait().then(() => {
        for (const path of Object.keys(proxies)) {
            const proxy = proxies[path];
            addCard(proxy.Name || poolName(path), proxy);
        }
        $("#no-pools").hidden = state.cards.size > 0;
        state.poolsKnown = true;
        performance.mark("flexiqd:pools");
        const cards = [...state.cards.values()];
        const inView = cards.filter(card => card.inView());
        for (const card of inView.reverse()) queueHistory(card, true);
        for (const card of cards) queueHistory(card, false);
        Promise.all(cards.map(card => card.history)).then(() => performance.mark("flexiqd:history"));
        // The page counts as loaded once the cards in view have their last hour.
        return Promise.all(inView.map(card => card.history));
    });
}

export function watchSignals() {
    client.subscribe({ path: MANAGER_PATH, interface: MANAGER, member: "ScaleEvent" }, (path, iface, signal, args) => {
        const [pool, previous, desired, reason, seq] = args;
        const card = state.cards.get(pool);
        if (!card) return;
        card.addEvent({ seq, at: Date.now() / 1000, pool, previous, desired, reason, rationale: "" });
        // The signal has no time and no rationale: Events has the whole record.
        call("Events", [Math.max(0, seq - 1)]).then(([json]) => {
            for (const event of JSON.parse(json)) {
                const target = state.cards.get(event.pool);
                if (target && event.seq === seq) target.addEvent(event);
            }
        }, () => {});
    });
    client.subscribe({ path: MANAGER_PATH, interface: MANAGER, member: "ConfigReloaded" }, (path, iface, signal, args) => {
        const [ok, message] = args;
        say((ok ? "Config reloaded: " : "Config rejected, the previous one still runs: ") + message, ok ? "ok" : "error");
        reloadHistories();  // the targets may have changed
        emit("reloaded");
    });
    client.addEventListener("close", (event, options) => {
        const banner = $("#not-running");
        banner.hidden = false;
        banner.textContent = "The connection to the system bus closed (" + cockpit.message(options) + "): reload the page.";
    });
    client.addEventListener("owner", (event, owner) => {
        const gone = owner === null;
        const banner = $("#not-running");
        banner.hidden = !gone;
        banner.textContent = gone ? "flexiqd is not running: start it with systemctl start flexiqd. The page follows it again once it runs." : "";
        if (!gone && state.started) {
            reloadHistories();
            emit("daemon");
        }
    });
}

export function wirePools() {
    on("steer", () => { for (const card of state.cards.values()) card.renderControls(); });
}
