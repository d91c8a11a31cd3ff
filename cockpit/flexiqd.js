/*
 * flexiqd's Cockpit page (docs/cockpit.md).
 *
 * Everything comes from flexiqd's D-Bus API, called as the logged-in user through
 * cockpit.dbus, so the bus policy and the daemon decide what this user may do: the
 * page cannot give anyone more than flexiqctl gives them.
 *
 * Live, from signals: each pool object's PropertiesChanged (after every tick) updates
 * its card and appends a point to its charts; ObjectManager's InterfacesAdded/Removed
 * add and remove cards; ScaleEvent marks a decision on the charts.  The Status document
 * (dependencies, machines, held-back jobs) is read again after ticks, at most every
 * STATUS_EVERY ms.  Nothing polls: the only timers coalesce the redraws and reads
 * that signals asked for.
 *
 * Methods a daemon may not have yet (History, Jobs, Job, RetryDead, PurgeDead) are
 * tried, and the section that needs one says so when it is missing.
 */
(function () {
    "use strict";

    const BUS_NAME = "org.flexiq.flexiqd1";
    const MANAGER_PATH = "/org/flexiq/flexiqd1";
    const MANAGER = "org.flexiq.flexiqd1.Manager";
    const POOL = "org.flexiq.flexiqd1.Pool";
    const HOUR = 3600;
    const STATUS_EVERY = 2000;      // ms: the Status document at most this often
    const CHART_EVERY = 1000;       // ms: a pool's charts redrawn at most this often
    const LIVE_STEP = 1000;         // ms: live points closer than this replace the last one
    const PAGE_SIZE = 25;
    const ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied";
    const UNKNOWN_METHOD = "org.freedesktop.DBus.Error.UnknownMethod";
    const NOT_RUNNING = ["org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner"];

    const $ = (selector, root) => (root || document).querySelector(selector);
    performance.mark("flexiqd:start");

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
    const client = cockpit.dbus(BUS_NAME, { bus: "system" });

    const state = {
        user: null,
        steer: { allowed: null, reason: "", short: "" },   // allowed null: not known yet
        cards: new Map(),                       // pool name -> PoolCard
        status: null,                           // the last Status document
        queues: new Set(),                      // every queue a pool serves
        poolsKnown: false,                      // the first list of pools is in
        started: false,
    };

    /* ---------------------------------------------------------------- formatting */

    function text(value) {
        return value === null || value === undefined ? "" : String(value);
    }

    function known(value) {
        // D-Bus has no null: flexiqd sends -1 for an unknown count and NaN (null here) for a number.
        return value !== null && value !== undefined && !(typeof value === "number" && (value < 0 || !isFinite(value)));
    }

    function seconds(value) {
        if (!known(value)) return "not known";
        if (value < 1) return value.toFixed(2) + " s";
        if (value < 60) return value.toFixed(value < 10 ? 1 : 0) + " s";
        if (value < HOUR) return Math.floor(value / 60) + " min " + Math.round(value % 60) + " s";
        return Math.floor(value / HOUR) + " h " + Math.round((value % HOUR) / 60) + " min";
    }

    function clock(epoch) {
        if (!known(epoch)) return "—";
        const date = new Date(epoch * 1000);
        const time = date.toLocaleTimeString([], { hour12: false });
        const today = new Date().toDateString() === date.toDateString();
        return today ? time : date.toLocaleDateString() + " " + time;
    }

    function plural(n, one, many) {
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

    function reasonWords(token) {
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

    function capWords(cap, max) {
        if (!cap) return "nothing: no cap limited the last decision";
        const [kind, name] = cap.split(/:(.*)/s);
        if (kind === "max") return "the pool's max_workers (" + max + ")";
        if (kind === "dependency") return "its share of the dependency “" + name + "”";
        if (kind === "latency") return "the latency of the dependency “" + name + "” (max_latency)";
        if (kind === "knee") return "the knee: more workers stopped adding throughput";
        if (kind === "starting") return "how many workers may start at once (start_burst)";
        return cap;
    }

    /* ---------------------------------------------------------------- D-Bus */

    function call(method, args) {
        return client.call(MANAGER_PATH, MANAGER, method, args || []);
    }

    function isMissing(error) {
        return error && error.name === UNKNOWN_METHOD;
    }

    function errorText(error) {
        if (!error) return "unknown error";
        if (NOT_RUNNING.includes(error.name)) return "flexiqd is not running (systemctl start flexiqd)";
        return error.message || cockpit.message(error);
    }


    function missingText(method) {
        return "This flexiqd has no " + method + " method on D-Bus (it is older than this page); update flexiqd to see this.";
    }

    /* ---------------------------------------------------------------- messages */

    function say(message, kind) {
        const box = $("#messages");
        const line = document.createElement("p");
        line.className = kind === "error" ? "problem" : "ok";
        line.textContent = message;
        if (kind === "error") line.setAttribute("role", "alert");
        box.prepend(line);
        while (box.children.length > 4) box.lastChild.remove();
    }

    /* ---------------------------------------------------------------- who may steer */

    function initAccess() {
        return cockpit.user().then(user => {
            state.user = user;
            const groups = user.groups || [];
            if (user.id === 0 || groups.includes("flexiq")) {
                setSteer(true, "");
            } else {
                setSteer(false, "Steering, the jobs and their arguments are for root and members of the group flexiq; " +
                    "you are logged in as " + user.name + " (groups: " + (groups.join(", ") || "none") + "). " +
                    "An administrator can add you with: usermod -aG flexiq " + user.name + " (effective at your next login).");
            }
        }, () => setSteer(false, "Cockpit could not say who you are, so the controls stay off."));
    }

    function setSteer(allowed, reason) {
        const who = state.user ? "; you are " + state.user.name : "";
        state.steer = {
            allowed, reason,
            short: allowed ? "" : reason.startsWith("flexiqd refused")
                ? reason : "Disabled: steering and the jobs are for root and members of the group flexiq" + who + ".",
        };
        const access = $("#access");
        if (allowed) {
            access.textContent = "You are " + (state.user ? state.user.name : "root") +
                (state.user && state.user.id === 0 ? " (root)" : ", a member of the group flexiq") +
                ": you may steer the pools and read the jobs.";
            access.className = "access allowed";
        } else {
            access.textContent = reason;
            access.className = "access denied";
        }
        for (const card of state.cards.values()) card.renderControls();
        renderGlobalControls();
        renderJobsAccess();
    }

    // An AccessDenied reply is the final word, whatever the groups said.
    function denied(error) {
        if (error && error.name === ACCESS_DENIED) {
            setSteer(false, "flexiqd refused: " + error.message);
            return true;
        }
        return false;
    }

    function applyControl(button, note, extraDisabled, extraReason) {
        const allowed = state.steer.allowed === true;
        button.disabled = !allowed || Boolean(extraDisabled);
        if (!allowed) {
            button.title = state.steer.short || "Checking whether you may steer…";
            button.setAttribute("aria-describedby", note.id);
        } else {
            button.title = extraDisabled ? extraReason || "" : "";
            button.removeAttribute("aria-describedby");
        }
    }

    function renderGlobalControls() {
        const note = $("#access");
        applyControl($("#reload-config"), note);
        for (const id of ["dead-retry", "dead-purge", "dead-retry-all", "dead-purge-all"])
            applyControl(document.getElementById(id), $("#dead-steer-note"));
        $("#dead-steer-note").textContent = state.steer.allowed === false ? state.steer.short : "";
    }

    /* ---------------------------------------------------------------- confirmation */

    function confirmAction(title, body, action) {
        const dialog = $("#confirm");
        $("#confirm-title").textContent = title;
        $("#confirm-text").textContent = body;
        $("#confirm-ok").textContent = action;
        return new Promise(resolve => {
            dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
            dialog.returnValue = "cancel";
            dialog.showModal();
            $("#confirm-cancel").focus();
        });
    }

    /* ---------------------------------------------------------------- pool cards */

    const MIN_SPAN = 5 * 60 * 1000;  // ms: the narrowest time axis a chart gets

    function marksStart(events, now) {
        return events.length ? eventMs(events[0]) : now;
    }

    // An event's time in whole milliseconds: a chart point (a Date) and its annotation must agree.
    function eventMs(event) {
        return Math.round(event.at * 1000);
    }

    class PoolCard {
        constructor(name, proxy) {
            this.name = name;
            this.proxy = proxy;
            this.rows = [];           // {t: ms, active, starting, draining, desired, runnable, running, delayed, oldest_age}
            this.events = new Map();  // seq -> event document
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
            this.renderFlags();
            this.renderSummary();
            this.renderControls();
            for (const queue of d.Queues || []) addQueue(queue);
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
            if (!known(d.Runnable)) add("No stats", "over");
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
            cell(reasonWords(d.Reason));
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

        refreshJob() {
            // An open job that may still change is read again after its pool's tick.
            if (jobDetail.id !== null && jobDetail.live && (this.data.Queues || []).includes(jobDetail.queue))
                refreshJobSoon();
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

        chartData() {
            // Decisions become points of the "desired" series, so each can carry its annotation.
            const events = this.sortedEvents();
            const workers = [], jobs = [], age = [];
            const target = this.target;
            let e = 0;
            const pushEvent = event => workers.push([new Date(eventMs(event)), null, null, null, event.desired]);
            for (const r of this.rows) {
                while (e < events.length && eventMs(events[e]) < r.t) pushEvent(events[e++]);
                const t = new Date(r.t);
                workers.push([t, r.active, r.starting, r.draining, r.desired]);
                jobs.push([t, r.runnable, r.running]);
                age.push([t, r.oldest_age, target]);
            }
            while (e < events.length) pushEvent(events[e++]);
            return { workers, jobs, age };
        }

        annotations() {
            return this.sortedEvents().map(event => ({
                series: "desired",
                x: eventMs(event),
                shortText: event.desired > event.previous ? "▲" : event.desired < event.previous ? "▼" : "•",
                text: clock(event.at) + ": " + event.previous + " → " + event.desired + " workers. " +
                    reasonWords(event.reason) + " (" + event.reason + ")." + (event.rationale ? " " + event.rationale : ""),
                cssClass: "decision " + (event.desired > event.previous ? "up" : "down"),
                tickHeight: 6,
            }));
        }

        draw() {
            if (typeof Dygraph === "undefined") {
                $(".chart-note", this.node).textContent = "The chart library (libjs-dygraphs) is not installed: no charts.";
                return;
            }
            this.dirty = false;
            this.lastDraw = performance.now();
            const data = this.chartData();
            // The last hour, or less when there is less: a chart of two minutes in an hour's width says nothing.
            const now = Date.now();
            const first = Math.min(this.rows.length ? this.rows[0].t : now, marksStart(this.sortedEvents(), now));
            const span = [Math.max(now - HOUR * 1000, Math.min(first, now - MIN_SPAN)), now];
            const marks = this.sortedEvents().map(eventMs);
            const underlay = (ctx, area, g) => {
                // Each decision as a thin dotted line across every chart of the pool.
                ctx.save();
                ctx.strokeStyle = "rgba(90, 90, 90, 0.45)";
                ctx.setLineDash([2, 3]);
                for (const x of marks) {
                    const px = g.toDomXCoord(x);
                    if (px < area.x || px > area.x + area.w) continue;
                    ctx.beginPath();
                    ctx.moveTo(px, area.y);
                    ctx.lineTo(px, area.y + area.h);
                    ctx.stroke();
                }
                ctx.restore();
            };
            if (!data.workers.length)
                $(".chart-note", this.node).textContent = (this.chartNote ? this.chartNote + " " : "") + "No samples yet.";
            if (!this.charts) this.charts = {};
            for (const name of Object.keys(SERIES)) {
                const figure = $('[data-chart="' + name + '"]', this.node);
                const div = $(".chart", figure);
                const file = data[name];
                if (!file.length) continue;
                if (!this.charts[name]) {
                    this.charts[name] = new Dygraph(div, file, this.chartOptions(name, figure, span, underlay));
                } else {
                    this.charts[name].updateOptions({ file, dateWindow: span, underlayCallback: underlay });
                }
                div.setAttribute("aria-label", this.chartSummary(name, file));
                figure.dataset.points = String(file.length);
            }
            if (this.charts.workers) this.charts.workers.setAnnotations(this.annotations());
        }

        chartOptions(name, figure, span, underlay) {
            const series = SERIES[name];
            const legend = document.createElement("ul");
            legend.className = "legend";
            for (const [label, color, dashed] of series) {
                const item = document.createElement("li");
                const swatch = document.createElement("span");
                swatch.className = "swatch";
                swatch.style.borderTopColor = color;
                swatch.style.borderTopStyle = dashed ? "dashed" : "solid";
                item.append(swatch, label + (dashed ? " (dashed)" : ""));
                legend.append(item);
            }
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

        chartSummary(name, file) {
            const values = i => file.map(row => row[i]).filter(v => v !== null && v !== undefined);
            const range = i => {
                const v = values(i);
                return v.length ? "from " + Math.min(...v) + " to " + Math.max(...v) : "no values";
            };
            const last = i => {
                for (let k = file.length - 1; k >= 0; k--) if (file[k][i] !== null && file[k][i] !== undefined) return file[k][i];
                return "not known";
            };
            const decisions = this.events.size;
            if (name === "workers")
                return "Workers of " + this.name + " in the last hour: now " + last(1) + " active, desired " + last(4) +
                    "; active " + range(1) + "; " + plural(decisions, "scale decision", "scale decisions") + ", listed below the charts.";
            if (name === "jobs")
                return "Runnable jobs of " + this.name + " in the last hour: now " + last(1) + ", " + range(1) +
                    "; running now " + last(2) + ".";
            const age = values(1);
            return "Oldest runnable job's age of " + this.name + " in the last hour: now " +
                (typeof last(1) === "number" ? seconds(last(1)) : "not known") +
                (age.length ? ", at most " + seconds(Math.max(...age)) : "") +
                (this.target !== null ? "; target " + seconds(this.target) + "." : ".");
        }
    }

    /* ---------------------------------------------------------------- the pools */

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

    function watchPools() {
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
            card.refreshJob();
            statusSoon();
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

    function watchManager() {
        const manager = client.proxy(MANAGER, MANAGER_PATH);
        const render = () => {
            if (!manager.valid) return;
            $("#daemon-line").textContent = "flexiqd " + text(manager.Version) + ", reading " + text(manager.ConfigPath) +
                (state.status ? "; fleet " + state.status.fleet + ", a decision every " + seconds(state.status.tick) : "");
            const problem = $("#config-error");
            problem.hidden = !manager.ConfigError;
            problem.textContent = manager.ConfigError
                ? "The last reload was rejected; the previous config still runs: " + manager.ConfigError : "";
        };
        manager.addEventListener("changed", render);
        state.renderManager = render;
        return manager.wait().then(render);
    }

    function watchSignals() {
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
                statusSoon();
            }
        });
    }

    function reloadConfig() {
        call("Reload").then(() => say("Reload requested; the outcome follows."), error => {
            if (!denied(error)) say("Reload: " + errorText(error), "error");
        });
    }

    /* ---------------------------------------------------------------- the Status document */

    let statusTimer = null, statusLast = 0, statusPending = false;

    function statusSoon() {
        if (statusTimer !== null) return;
        const wait = Math.max(0, STATUS_EVERY - (performance.now() - statusLast));
        statusTimer = window.setTimeout(() => {
            statusTimer = null;
            loadStatus();
        }, wait);
    }

    function loadStatus() {
        if (statusPending) return Promise.resolve();
        statusPending = true;
        statusLast = performance.now();
        return call("Status").then(([json]) => {
            state.status = JSON.parse(json);
            renderStatus();
        }, error => {
            $("#dependencies-note").textContent = "The status could not be read: " + errorText(error);
        }).finally(() => { statusPending = false; });
    }

    function cells(row, values) {
        for (const value of values) {
            const cell = document.createElement("td");
            if (value instanceof Node) cell.append(value); else cell.textContent = value;
            row.append(cell);
        }
        return row;
    }

    function meter(value, max, label) {
        const m = document.createElement("meter");
        m.min = 0;
        m.max = max;
        m.value = value;
        m.high = max * 0.9;
        m.setAttribute("aria-label", label);
        return m;
    }

    function renderStatus() {
        const status = state.status;
        if (state.renderManager) state.renderManager();
        for (const card of state.cards.values()) {
            // A newer Status has the age target and the binding cap's count (an older one:
            // the target comes from History only).
            const entry = (status.pools || {})[card.name] || {};
            if (known(entry.target_age) && card.target !== entry.target_age) {
                card.target = entry.target_age;
                card.render();
            } else {
                card.renderHeld();
            }
        }
        for (const name of Object.keys(status.pools || {}))
            for (const queue of status.pools[name].queues || []) addQueue(queue);

        // Dependencies.
        const deps = status.dependencies;
        const depTable = $("#dependencies");
        const depNote = $("#dependencies-note");
        const depBody = $("tbody", depTable);
        depBody.replaceChildren();
        if (deps === undefined) {
            depNote.textContent = "This flexiqd does not report its dependencies (its Status has no dependencies list); update flexiqd to see them.";
            depTable.hidden = true;
        } else if (!deps.length) {
            depNote.textContent = "No shared dependencies are declared (dependencies: in the config).";
            depTable.hidden = true;
        } else {
            depNote.textContent = "As of " + clock(status.generated_at) + ".";
            depTable.hidden = false;
            for (const dep of deps) {
                const row = document.createElement("tr");
                const name = document.createElement("th");
                name.scope = "row";
                name.textContent = dep.name;
                row.append(name);
                let use = "no capacity declared";
                if (known(dep.capacity)) {
                    const span = document.createElement("span");
                    const free = dep.capacity - (dep.reserved || 0);
                    span.append(meter(dep.use || 0, dep.capacity, dep.name + " use of capacity"),
                        " " + text(dep.use) + " of " + dep.capacity + (dep.reserved ? " (" + dep.reserved + " reserved for others: " + free + " for the pools)" : ""));
                    use = span;
                }
                const limit = dep.limit
                    ? [dep.limit.concurrency !== null && dep.limit.concurrency !== undefined ? "at most " + dep.limit.concurrency + " jobs at once" : "",
                        dep.limit.rate !== null && dep.limit.rate !== undefined ? dep.limit.rate + " starts a second" : ""].filter(Boolean).join(", ") || "none"
                    : "none";
                const inside = dep.limit && known(dep.limit.concurrency) && dep.in_use !== undefined && dep.in_use !== null
                    ? dep.in_use + " of " + dep.limit.concurrency
                    : dep.in_use !== undefined && dep.in_use !== null ? String(dep.in_use) : "—";
                cells(row, [use, limit, inside, dep.waiting === null || dep.waiting === undefined ? "not known" : String(dep.waiting)]);
                depBody.append(row);
            }
        }

        // Held back, by pool.
        const heldTable = $("#held");
        const heldBody = $("tbody", heldTable);
        heldBody.replaceChildren();
        const pools = Object.values(status.pools || {});
        const reported = pools.some(p => p.metrics && p.metrics.held_by_tenant_cap !== undefined);
        $("#held-note").textContent = reported
            ? "Jobs that more workers would not start sooner: a tenant at its cap (tenants: in the config), or a dependency at its limit."
            : "This flexiqd does not report jobs held back by tenant caps or dependencies; update flexiqd to see them.";
        heldTable.hidden = !reported;
        for (const pool of pools) {
            const m = pool.metrics || {};
            const row = document.createElement("tr");
            const name = document.createElement("th");
            name.scope = "row";
            name.textContent = pool.name;
            row.append(name);
            cells(row, [m.held_by_tenant_cap === undefined ? "not known" : String(m.held_by_tenant_cap),
                m.waiting_for_dependency === undefined ? "not known" : String(m.waiting_for_dependency)]);
            heldBody.append(row);
        }

        renderHosts(status.hosts);
    }

    function renderHosts(hosts) {
        const note = $("#hosts-note");
        const table = $("#hosts");
        const caps = $("#global-caps");
        const body = $("tbody", table);
        const capBody = $("tbody", caps);
        body.replaceChildren();
        capBody.replaceChildren();
        if (!hosts) {
            note.textContent = state.status && state.status.hosts === undefined
                ? "This flexiqd does not report the machines sharing its store."
                : "No machines share this store: it is this machine's own (SQLite), or the daemon is still starting.";
            table.hidden = caps.hidden = true;
            return;
        }
        note.textContent = "This machine is " + hosts.host + "." +
            (known(hosts.beat_failing_for) ? " Its heartbeat has been failing for " + seconds(hosts.beat_failing_for) + "." : "") +
            " Jobs handed back from dead machines since the daemon started: " + text(hosts.rescued_jobs) + ".";
        table.hidden = false;
        const now = Date.now() / 1000;
        for (const member of hosts.members || []) {
            const row = document.createElement("tr");
            const name = document.createElement("th");
            name.scope = "row";
            name.textContent = member.name + (member.name === hosts.host ? " (this one)" : "");
            row.append(name);
            cells(row, [member.alive ? "alive" : "not heard from: presumed dead",
                known(member.last_beat) ? clock(member.last_beat) + " (" + seconds(Math.max(0, now - member.last_beat)) + " ago)" : "never",
                seconds(member.interval)]);
            body.append(row);
        }
        const global = hosts.global || {};
        const names = Object.keys(global);
        caps.hidden = !names.length;
        for (const name of names) {
            const g = global[name];
            const row = document.createElement("tr");
            const head = document.createElement("th");
            head.scope = "row";
            head.textContent = name;
            row.append(head);
            cells(row, [text(g.capacity), text(g.fleet_use), text(g.fleet_claimed), text(g.share), text(g.use)]);
            capBody.append(row);
        }
    }

    /* ---------------------------------------------------------------- queues known */

    function addQueue(queue) {
        if (state.queues.has(queue)) return;
        state.queues.add(queue);
        const sorted = [...state.queues].sort();
        const list = $("#queue-names");
        list.replaceChildren(...sorted.map(q => { const o = document.createElement("option"); o.value = q; return o; }));
        const select = $("#dead-queue");
        const chosen = select.value;
        const every = document.createElement("option");
        every.value = "";
        every.textContent = "every queue";
        select.replaceChildren(every, ...sorted.map(q => { const o = document.createElement("option"); o.value = q; o.textContent = q; return o; }));
        select.value = chosen;
    }

    /* ---------------------------------------------------------------- jobs */

    const jobs = { cursors: [null], page: 0, next: null, query: {} };
    const dead = { cursors: [null], page: 0, next: null, queue: "" };
    const jobDetail = { id: null, queue: null, live: false, timer: null, last: 0 };

    function renderJobsAccess() {
        const allowed = state.steer.allowed === true;
        const note = $("#jobs-note");
        for (const form of [$("#jobs-form"), $("#dead-form")]) form.querySelector("fieldset").disabled = !allowed;
        if (state.steer.allowed === false) {
            note.textContent = state.steer.reason + " A job's arguments, result and errors are data other users cannot read from the store either (docs/security.md).";
            $("#jobs").hidden = $("#jobs-pager").hidden = $("#job-detail").hidden = true;
            $("#dead").hidden = $("#dead-pager").hidden = true;
        } else if (allowed && !state.jobsLoaded) {
            state.jobsLoaded = true;
            note.textContent = "";
            searchJobs(null);
            showDead(null);
        }
    }

    function formQuery() {
        const form = $("#jobs-form");
        const query = {};
        for (const name of ["queue", "task", "state", "tenant"]) {
            const value = form.elements[name].value.trim();
            if (value) query[name] = value;
        }
        return query;
    }

    function jobsCall(query) {
        return call("Jobs", [JSON.stringify(query)]).then(([json]) => JSON.parse(json));
    }

    function jobsProblem(error, where) {
        if (denied(error)) return;
        where.textContent = isMissing(error) ? missingText("Jobs") : "The jobs could not be read: " + errorText(error);
    }

    function searchJobs(before) {
        const query = { ...jobs.query, limit: PAGE_SIZE };
        if (before !== null) query.before = before;
        return jobsCall(query).then(doc => {
            jobs.next = doc.next;
            renderJobRows(doc.jobs);
        }, error => jobsProblem(error, $("#jobs-note")));
    }

    function jobButton(job) {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "link";
        button.textContent = "#" + job.id;
        button.setAttribute("aria-label", "Show job " + job.id);
        button.addEventListener("click", () => openJob(job.id));
        return button;
    }

    function ranFor(job) {
        if (known(job.started_at) && known(job.finished_at)) return seconds(job.finished_at - job.started_at);
        if (known(job.started_at)) return "running for " + seconds(Date.now() / 1000 - job.started_at);
        return "—";
    }

    function shortError(error) {
        if (!error) return "";
        const first = String(error).split("\n").filter(Boolean).pop() || "";
        return first.length > 90 ? first.substring(0, 89) + "…" : first;
    }

    function stateCell(job) {
        const span = document.createElement("span");
        span.className = "state state-" + job.state;
        span.textContent = job.state;
        return span;
    }

    function renderJobRows(list) {
        const table = $("#jobs");
        const body = $("tbody", table);
        body.replaceChildren();
        table.hidden = false;
        $("#jobs-note").textContent = list.length ? "" : "No jobs match.";
        $("#jobs-caption").textContent = "Jobs, newest first, page " + (jobs.page + 1) +
            (Object.keys(jobs.query).length ? " (" + Object.entries(jobs.query).map(([k, v]) => k + " " + v).join(", ") + ")" : "");
        for (const job of list) {
            const row = document.createElement("tr");
            row.dataset.job = job.id;
            const head = document.createElement("th");
            head.scope = "row";
            head.append(jobButton(job));
            row.append(head);
            cells(row, [job.queue, job.task, stateCell(job), job.tenant || "—", job.attempts + " of " + job.max_attempts,
                clock(job.enqueued_at), ranFor(job), shortError(job.error)]);
            body.append(row);
        }
        const pager = $("#jobs-pager");
        pager.hidden = jobs.page === 0 && jobs.next === null;
        $("#jobs-newer").disabled = jobs.page === 0;
        $("#jobs-older").disabled = jobs.next === null;
        $("#jobs-page").textContent = "Page " + (jobs.page + 1);
    }

    function openJob(id) {
        jobDetail.id = id;
        return loadJob(true);
    }

    function refreshJobSoon() {
        if (jobDetail.timer !== null) return;
        const wait = Math.max(0, 1000 - (performance.now() - jobDetail.last));
        jobDetail.timer = window.setTimeout(() => {
            jobDetail.timer = null;
            loadJob(false);
        }, wait);
    }

    function loadJob(focus) {
        const id = jobDetail.id;
        if (id === null) return Promise.resolve();
        jobDetail.last = performance.now();
        return call("Job", [id]).then(([json]) => {
            if (jobDetail.id !== id) return;
            const doc = JSON.parse(json);
            jobDetail.queue = doc.job.queue;
            // A job still waiting or running is followed at each tick of its pool.
            jobDetail.live = doc.job.state === "queued" || doc.job.state === "running";
            renderJob(doc, focus);
        }, error => {
            if (denied(error)) return;
            const section = $("#job-detail");
            section.hidden = false;
            $("#job-detail-heading").textContent = "Job " + id;
            $("#job-detail-body").textContent = isMissing(error) ? missingText("Job") : errorText(error);
            jobDetail.live = false;
        });
    }

    function definitionList(pairs) {
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

    function pre(value, label) {
        const block = document.createElement("pre");
        block.textContent = typeof value === "string" ? value : JSON.stringify(value, null, 2);
        block.setAttribute("aria-label", label);
        block.tabIndex = 0;
        return block;
    }

    function renderJob(doc, focus) {
        const job = doc.job;
        const section = $("#job-detail");
        section.hidden = false;
        section.dataset.job = job.id;
        section.dataset.state = job.state;
        $("#job-detail-heading").textContent = "Job " + job.id + ": " + job.task + " (" + job.state + ")";
        const body = $("#job-detail-body");
        body.replaceChildren();
        const waited = known(job.started_at) && known(job.run_at) ? seconds(Math.max(0, job.started_at - Math.max(job.enqueued_at, job.run_at))) : "—";
        body.append(definitionList([
            ["State", stateCell(job)],
            ["Queue", job.queue],
            ["Task", job.task],
            ["Tenant", job.tenant || "—"],
            ["Priority", text(job.priority)],
            ["Attempts", job.attempts + " of " + job.max_attempts],
            ["Enqueued", clock(job.enqueued_at)],
            ["Due", clock(job.run_at)],
            ["Started", clock(job.started_at)],
            ["Finished", clock(job.finished_at)],
            ["Waited", waited],
            ["Ran for", ranFor(job)],
            ["Timeout", known(job.timeout) ? seconds(job.timeout) : "none"],
            ["Held by", job.lease_owner || "—"],
            ["Idempotency key", job.idempotency_key || "—"],
        ]));
        const args = document.createElement("h4");
        args.textContent = "Arguments";
        body.append(args, pre(job.payload, "Arguments of job " + job.id));
        if (job.result !== null && job.result !== undefined) {
            const h = document.createElement("h4");
            h.textContent = "Result";
            body.append(h, pre(job.result, "Result of job " + job.id));
        }
        if (job.error) {
            const h = document.createElement("h4");
            h.textContent = "Error";
            body.append(h, pre(job.error, "Error of job " + job.id));
        }
        const h = document.createElement("h4");
        h.textContent = "Attempts";
        body.append(h);
        if (!doc.attempts || !doc.attempts.length) {
            const p = document.createElement("p");
            p.textContent = "No attempt recorded.";
            body.append(p);
        } else {
            const table = document.createElement("table");
            table.innerHTML = "<thead><tr><th scope='col'>Attempt</th><th scope='col'>Worker</th><th scope='col'>Started</th>" +
                "<th scope='col'>Finished</th><th scope='col'>Outcome</th><th scope='col'>Error</th></tr></thead><tbody></tbody>";
            for (const attempt of doc.attempts) {
                table.tBodies[0].append(cells(document.createElement("tr"), [String(attempt.attempt), attempt.worker || "—",
                    clock(attempt.started_at), clock(attempt.finished_at), attempt.outcome || "—", shortError(attempt.error)]));
            }
            body.append(table);
        }
        if (job.state === "dead") {
            const actions = document.createElement("div");
            actions.className = "actions";
            const retry = document.createElement("button");
            retry.type = "button";
            retry.className = "steer";
            retry.textContent = "Retry this job";
            retry.addEventListener("click", () => retryDead(job.queue, [job.id]));
            const purge = document.createElement("button");
            purge.type = "button";
            purge.className = "steer danger";
            purge.textContent = "Purge this job…";
            purge.addEventListener("click", () => purgeDead(job.queue, [job.id]));
            const note = document.createElement("p");
            note.className = "steer-note subtle";
            note.id = "job-steer-note";
            note.textContent = state.steer.allowed === false ? state.steer.short : "";
            actions.append(retry, purge);
            body.append(actions, note);
            applyControl(retry, note);
            applyControl(purge, note);
        }
        if (focus) $("#job-detail-heading").focus();
    }

    /* ---------------------------------------------------------------- dead letters */

    function showDead(before) {
        const query = { state: "dead", limit: PAGE_SIZE };
        if (dead.queue) query.queue = dead.queue;
        if (before !== null) query.before = before;
        return jobsCall(query).then(doc => {
            dead.next = doc.next;
            renderDeadRows(doc.jobs);
        }, error => jobsProblem(error, $("#dead-note")));
    }

    function renderDeadRows(list) {
        const table = $("#dead");
        const body = $("tbody", table);
        body.replaceChildren();
        table.hidden = !list.length;
        $("#dead-all").checked = false;
        $("#dead-note").textContent = list.length
            ? "Jobs that failed for good. Retry gives them fresh attempts; purge deletes them."
            : "No dead letters" + (dead.queue ? " in the queue " + dead.queue : "") + ".";
        $("#dead-caption").textContent = "Dead letters" + (dead.queue ? " of " + dead.queue : "") + ", newest first, page " + (dead.page + 1);
        for (const job of list) {
            const row = document.createElement("tr");
            row.dataset.job = job.id;
            const pick = document.createElement("input");
            pick.type = "checkbox";
            pick.value = job.id;
            pick.dataset.queue = job.queue;
            pick.setAttribute("aria-label", "Select dead letter " + job.id);
            const pickCell = document.createElement("td");
            pickCell.append(pick);
            row.append(pickCell);
            const head = document.createElement("th");
            head.scope = "row";
            head.append(jobButton(job));
            row.append(head);
            cells(row, [job.queue, job.task, job.tenant || "—", job.attempts + " of " + job.max_attempts,
                clock(job.finished_at), shortError(job.error)]);
            body.append(row);
        }
        $("#dead-pager").hidden = dead.page === 0 && dead.next === null;
        $("#dead-newer").disabled = dead.page === 0;
        $("#dead-older").disabled = dead.next === null;
        $("#dead-page").textContent = "Page " + (dead.page + 1);
    }

    function selectedDead() {
        return [...document.querySelectorAll("#dead tbody input[type=checkbox]:checked")]
            .map(box => ({ id: Number(box.value), queue: box.dataset.queue }));
    }

    // RetryDead/PurgeDead take one queue (or "" for every queue) and ids.
    function byQueue(picked) {
        const groups = new Map();
        for (const { id, queue } of picked) {
            if (!groups.has(queue)) groups.set(queue, []);
            groups.get(queue).push(id);
        }
        return groups;
    }

    function deadCall(method, queue, ids) {
        return call(method, [queue, ids]).then(([n]) => n);
    }

    function afterDead(promises, verb) {
        return Promise.all(promises).then(counts => {
            const n = counts.reduce((a, b) => a + b, 0);
            say(verb + " " + plural(n, "dead letter", "dead letters") + ".");
            showDead(dead.cursors[dead.page]);
            if (jobDetail.id !== null) loadJob(false);
            if (state.jobsLoaded) searchJobs(jobs.cursors[jobs.page]);
        }, error => {
            if (denied(error)) return;
            say(isMissing(error) ? missingText(verb === "Revived" ? "RetryDead" : "PurgeDead") : verb + ": " + errorText(error), "error");
        });
    }

    function retryDead(queue, ids) {
        return afterDead([deadCall("RetryDead", queue, ids)], "Revived");
    }

    function purgeDead(queue, ids) {
        const what = ids.length ? plural(ids.length, "dead letter", "dead letters") + " (" + ids.map(i => "#" + i).join(", ") + ")"
            : "every dead letter" + (queue ? " of the queue " + queue : " of every queue");
        return confirmAction("Purge " + what + "?", "Purged jobs and their attempts are deleted for good; they cannot be retried.", "Purge")
            .then(ok => ok && afterDead([deadCall("PurgeDead", queue, ids)], "Purged"));
    }

    function wireJobs() {
        $("#jobs-form").addEventListener("submit", event => {
            event.preventDefault();
            jobs.query = formQuery();
            jobs.cursors = [null];
            jobs.page = 0;
            searchJobs(null);
        });
        $("#jobs-older").addEventListener("click", () => {
            if (jobs.next === null) return;
            jobs.cursors[++jobs.page] = jobs.next;
            searchJobs(jobs.next);
        });
        $("#jobs-newer").addEventListener("click", () => {
            if (jobs.page === 0) return;
            searchJobs(jobs.cursors[--jobs.page]);
        });
        $("#job-detail-close").addEventListener("click", () => {
            jobDetail.id = null;
            jobDetail.live = false;
            $("#job-detail").hidden = true;
        });
        $("#job-detail-heading").tabIndex = -1;
        $("#dead-form").addEventListener("submit", event => {
            event.preventDefault();
            dead.queue = $("#dead-queue").value;
            dead.cursors = [null];
            dead.page = 0;
            showDead(null);
        });
        $("#dead-older").addEventListener("click", () => {
            if (dead.next === null) return;
            dead.cursors[++dead.page] = dead.next;
            showDead(dead.next);
        });
        $("#dead-newer").addEventListener("click", () => {
            if (dead.page === 0) return;
            showDead(dead.cursors[--dead.page]);
        });
        $("#dead-all").addEventListener("change", event => {
            for (const box of document.querySelectorAll("#dead tbody input[type=checkbox]")) box.checked = event.target.checked;
        });
        $("#dead-retry").addEventListener("click", () => {
            const picked = selectedDead();
            if (!picked.length) return say("Select the dead letters to retry first.", "error");
            afterDead([...byQueue(picked)].map(([queue, ids]) => deadCall("RetryDead", queue, ids)), "Revived");
        });
        $("#dead-purge").addEventListener("click", () => {
            const picked = selectedDead();
            if (!picked.length) return say("Select the dead letters to purge first.", "error");
            confirmAction("Purge " + plural(picked.length, "dead letter", "dead letters") + "?",
                "Purged jobs and their attempts are deleted for good; they cannot be retried. " + picked.map(p => "#" + p.id).join(", "), "Purge")
                .then(ok => ok && afterDead([...byQueue(picked)].map(([queue, ids]) => deadCall("PurgeDead", queue, ids)), "Purged"));
        });
        $("#dead-retry-all").addEventListener("click", () => retryDead(dead.queue, []));
        $("#dead-purge-all").addEventListener("click", () => purgeDead(dead.queue, []));
        $("#reload-config").addEventListener("click", reloadConfig);
    }

    /* ---------------------------------------------------------------- start */

    function start() {
        wireJobs();
        watchSignals();
        renderGlobalControls();
        const access = initAccess();
        const ready = Promise.all([watchManager(), watchPools(), loadStatus(), access]);
        ready.then(() => {
            state.started = true;
            // Draw the charts in view now rather than when the observer reports them.
            for (const card of state.cards.values()) {
                if (card.inView()) {
                    card.visible = true;
                    if (card.dirty && card.loaded) card.draw();
                }
            }
            // How long the page took from its navigation to pools, history and visible charts
            // (docs/cockpit.md): requestAnimationFrame waits for the drawing to be painted.
            performance.mark("flexiqd:drawn");
            window.requestAnimationFrame(() => {
                performance.mark("flexiqd:ready");
                document.documentElement.dataset.loadedMs = String(Math.round(performance.now()));
                document.documentElement.dataset.ready = "true";
            });
        }, error => {
            const banner = $("#not-running");
            banner.hidden = false;
            banner.textContent = NOT_RUNNING.includes(error && error.name)
                ? "flexiqd is not running: start it with systemctl start flexiqd."
                : "flexiqd could not be read: " + errorText(error);
            document.documentElement.dataset.ready = "error";
        });
    }

    start();
}());
