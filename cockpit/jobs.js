/*
 * The jobs (root and the group flexiq-admin): search, one job's details (followed while it may
 * still change), and the dead letters with retry and purge.  Other users get a note
 * instead: a job's arguments, result and errors are not theirs to read (docs/security.md).
 */

import { $, cells, clock, definitionList, known, plural, pre, seconds, text } from "./format.js";
import { call, errorText, isMissing, missingText } from "./bus.js";
import { on, say, state } from "./page.js";
import { applyControl, confirmAction, denied } from "./steering.js";

const PAGE_SIZE = 25;

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

export function wireJobs() {
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
    on("queue", addQueue);
    on("steer", renderJobsAccess);
    // An open job that may still change is read again after its pool's tick.
    on("tick", card => {
        if (jobDetail.id !== null && jobDetail.live && (card.data.Queues || []).includes(jobDetail.queue))
            refreshJobSoon();
    });
}

