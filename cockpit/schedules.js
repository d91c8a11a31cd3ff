/*
 * The schedules (docs/schedules.md): each one's calendar, next fire, last slot with its
 * job and outcome, slots fired and skipped, paused or not; Run now / Pause / Resume for
 * those who may steer (no buttons for the others).  The Schedules document is read at
 * start and again after ticks, at most every SCHEDULES_EVERY ms; each fire it reports
 * (the last slot fired, the last run) is marked on the charts of the pools serving the
 * schedule's queue, so the charts collect the fires seen while the page is open.
 */

import { $, cells, clock, known, rowHeader, seconds } from "./format.js";
import { call, errorText, isMissing, missingText } from "./bus.js";
import { coalesced, on, say, state } from "./page.js";
import { applyControl, denied } from "./steering.js";

const SCHEDULES_EVERY = 2000;   // ms: the Schedules document at most this often

export const loadSchedules = coalesced(() => call("Schedules").then(([json]) => {
    state.schedules = JSON.parse(json);
    render();
    for (const card of state.cards.values()) markFires(card);
}, error => {
    state.schedules = null;
    $("#schedules").hidden = true;
    $("#schedules-note").textContent = isMissing(error) ? missingText("Schedules")
        : "The schedules could not be read: " + errorText(error);
}), SCHEDULES_EVERY);

function entries() {
    return Object.entries((state.schedules && state.schedules.schedules) || {});
}

// The fires the document reports, on the charts of a pool that serves the schedule's queue.
function markFires(card) {
    for (const [name, entry] of entries()) {
        if (!(entry.pools || []).includes(card.name)) continue;
        const slot = entry.last;
        if (slot && slot.outcome === "fired" && known(slot.slot))
            card.addFire({ at: slot.slot, schedule: name, kind: "slot", job_id: slot.job_id });
        const run = entry.last_run;
        if (run && known(run.slot))
            card.addFire({ at: run.slot, schedule: name, kind: "run", job_id: run.job_id });
    }
}

function jobWords(row) {
    if (row.job_id === null || row.job_id === undefined) return "";
    return "job #" + row.job_id + " (" + (row.job_state || "deleted") + ")";
}

function lastWords(entry) {
    const slot = entry.last;
    if (!slot) return "none yet";
    const what = slot.outcome === "fired"
        ? "fired" + (slot.slots > 1 ? " for " + slot.slots + " slots" : "") + ": " + jobWords(slot)
        : "skipped" + (slot.slots > 1 ? " " + slot.slots + " slots" : "") + " (" + (slot.reason || "no reason given") + ")";
    return clock(slot.slot) + " " + what;
}

function nextWords(entry) {
    if (entry.paused) return "none: paused";
    if (!known(entry.next_fire)) return "not known yet";
    const inSeconds = entry.next_fire - Date.now() / 1000;
    return clock(entry.next_fire) + (inSeconds >= 0 ? " (in " + seconds(inSeconds) + ")" : " (due)");
}

function render() {
    const list = entries();
    const table = $("#schedules");
    const note = $("#schedules-note");
    const allowed = state.steer.allowed === true;
    table.hidden = !list.length;
    $("#schedules-actions-head").hidden = !allowed;
    note.textContent = list.length
        ? (allowed ? "" : "Run now, pause and resume are for root and members of the group flexiq-admin.")
        : "No schedules are configured (schedules: in the config, docs/schedules.md).";
    const body = $("tbody", table);
    body.replaceChildren();
    for (const [name, entry] of list) {
        const row = document.createElement("tr");
        row.dataset.schedule = name;
        row.dataset.paused = String(Boolean(entry.paused));
        row.append(rowHeader(name));
        const run = entry.last_run ? "; run now " + clock(entry.last_run.slot) + ": " + jobWords(entry.last_run) : "";
        cells(row, [
            entry.task,
            entry.cron + " (" + entry.timezone + ")",
            entry.queue + " (" + ((entry.pools || []).join(", ") || "no pool here serves it") + ")",
            nextWords(entry),
            lastWords(entry) + run,
            entry.fired + " fired, " + entry.skipped + " skipped",
            entry.paused ? "paused" : "active",
        ]);
        row.cells[row.cells.length - 1].className = entry.paused ? "schedule-paused" : "";
        if (allowed) row.append(actions(name, entry));
        body.append(row);
    }
}

function actions(name, entry) {
    const cell = document.createElement("td");
    cell.className = "actions";
    const button = (action, label, off, why, method, done) => {
        const b = document.createElement("button");
        b.type = "button";
        b.className = "steer";
        b.dataset.action = action;
        b.textContent = label;
        b.setAttribute("aria-label", label + " " + name);
        b.addEventListener("click", () => steer(method, name, done));
        applyControl(b, $("#schedules-note"), off, why);
        cell.append(b);
    };
    button("run", "Run now", false, "", "RunSchedule",
        ([job]) => "Ran the schedule " + name + " now: job #" + job + " (no slot taken).");
    button("pause", "Pause", entry.paused, "The schedule is paused already.", "PauseSchedule",
        ([changed]) => changed ? "Paused the schedule " + name + ": its slots are skipped on every host until resumed."
            : "The schedule " + name + " was paused already.");
    button("resume", "Resume", !entry.paused, "The schedule is not paused.", "ResumeSchedule",
        ([changed]) => changed ? "Resumed the schedule " + name + ": its next slot fires (the skipped ones do not)."
            : "The schedule " + name + " was not paused.");
    return cell;
}

function steer(method, name, done) {
    return call(method, [name]).then(reply => {
        say(done(reply));
        loadSchedules();
    }, error => {
        if (denied(error)) say("flexiqd refused " + method + " " + name + ": " + error.message, "error");
        else say(method + " " + name + ": " + errorText(error), "error");
    });
}

export function wireSchedules() {
    on("steer", () => { if (state.schedules) render(); });
    on("tick", loadSchedules.soon);
    on("daemon", loadSchedules.soon);
    on("reloaded", loadSchedules.soon);
    on("card", markFires);
}
