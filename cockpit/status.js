/*
 * The daemon's line (the manager's properties) and the Status document: the shared
 * dependencies, the jobs held back by pool, the machines sharing the store.  Status is
 * read again after ticks, at most every STATUS_EVERY ms.
 */

import { $, cells, clock, known, meter, rowHeader, seconds, text } from "./format.js";
import { MANAGER, MANAGER_PATH, call, client, errorText } from "./bus.js";
import { coalesced, emit, on, state } from "./page.js";

const STATUS_EVERY = 2000;      // ms: the Status document at most this often

export function watchManager() {
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

export const loadStatus = coalesced(() => call("Status").then(([json]) => {
    state.status = JSON.parse(json);
    renderStatus();
}, error => {
    $("#dependencies-note").textContent = "The status could not be read: " + errorText(error);
}), STATUS_EVERY);

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
        for (const queue of status.pools[name].queues || []) emit("queue", queue);

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
            row.append(rowHeader(dep.name));
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
        row.append(rowHeader(pool.name));
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
        row.append(rowHeader(member.name + (member.name === hosts.host ? " (this one)" : "")));
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
        row.append(rowHeader(name));
        cells(row, [text(g.capacity), text(g.fleet_use), text(g.fleet_claimed), text(g.share), text(g.use)]);
        capBody.append(row);
    }
}

export function wireStatus() {
    on("tick", loadStatus.soon);
    on("daemon", loadStatus.soon);
}
