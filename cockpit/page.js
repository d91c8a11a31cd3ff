/*
 * The page's one state, the events its parts tell each other, and the message box.
 *
 * State lives here and flows down: a part changes it and emits an event, the parts that
 * show it listen.  Events: "steer" (who may steer changed), "card" (a pool's card was
 * made: card), "tick" (a pool's properties changed: card), "queue" (a queue a pool
 * serves: name), "daemon" (flexiqd runs again after it was gone), "reloaded" (flexiqd
 * took or rejected a new config).
 */

import { $ } from "./format.js";

export const state = {
    user: null,
    steer: { allowed: null, reason: "", short: "" },   // allowed null: not known yet
    cards: new Map(),                       // pool name -> PoolCard
    status: null,                           // the last Status document
    schedules: null,                        // the last Schedules document
    queues: new Set(),                      // every queue a pool serves
    poolsKnown: false,                      // the first list of pools is in
    started: false,
};

const listeners = new Map();

export function on(event, listener) {
    if (!listeners.has(event)) listeners.set(event, []);
    listeners.get(event).push(listener);
}

export function emit(event, ...args) {
    for (const listener of listeners.get(event) || []) listener(...args);
}

export function say(message, kind) {
    const box = $("#messages");
    const line = document.createElement("p");
    line.className = kind === "error" ? "problem" : "ok";
    line.textContent = message;
    if (kind === "error") line.setAttribute("role", "alert");
    box.prepend(line);
    while (box.children.length > 4) box.lastChild.remove();
}

// A read of a document that signals ask for often: ``read()`` now (none while one is under
// way), or ``read.soon()``, which coalesces the asks into one read at most every ``every`` ms.
export function coalesced(load, every) {
    let timer = null, last = 0, pending = false;
    const read = () => {
        if (pending) return Promise.resolve();
        pending = true;
        last = performance.now();
        return load().finally(() => { pending = false; });
    };
    read.soon = () => {
        if (timer !== null) return;
        timer = window.setTimeout(() => {
            timer = null;
            read();
        }, Math.max(0, every - (performance.now() - last)));
    };
    return read;
}
