/*
 * Who may steer, and the controls that depend on it.
 *
 * The page asks Cockpit who the user is: root and members of the group flexiq-admin may steer
 * (the bus policy's rule, units/org.flexiq.flexiqd1.conf).  That is a courtesy only: every
 * call goes to the bus as the user, and an AccessDenied reply is the final word.
 */

import { $ } from "./format.js";
import { ACCESS_DENIED, call, errorText } from "./bus.js";
import { emit, on, say, state } from "./page.js";

export function initAccess() {
    return cockpit.user().then(user => {
        state.user = user;
        const groups = user.groups || [];
        if (user.id === 0 || groups.includes("flexiq-admin")) {
            setSteer(true, "");
        } else {
            setSteer(false, "Steering, the jobs and their arguments are for root and members of the group flexiq-admin; " +
                "you are logged in as " + user.name + " (groups: " + (groups.join(", ") || "none") + "). " +
                "An administrator can add you with: usermod -aG flexiq-admin " + user.name + " (effective at your next login).");
        }
    }, () => setSteer(false, "Cockpit could not say who you are, so the controls stay off."));
}

function setSteer(allowed, reason) {
    const who = state.user ? "; you are " + state.user.name : "";
    state.steer = {
        allowed, reason,
        short: allowed ? "" : reason.startsWith("flexiqd refused")
            ? reason : "Disabled: steering and the jobs are for root and members of the group flexiq-admin" + who + ".",
    };
    const access = $("#access");
    if (allowed) {
        access.textContent = "You are " + (state.user ? state.user.name : "root") +
            (state.user && state.user.id === 0 ? " (root)" : ", a member of the group flexiq-admin") +
            ": you may steer the pools and read the jobs.";
        access.className = "access allowed";
    } else {
        access.textContent = reason;
        access.className = "access denied";
    }
    emit("steer");
}

// An AccessDenied reply is the final word, whatever the groups said.
export function denied(error) {
    if (error && error.name === ACCESS_DENIED) {
        setSteer(false, "flexiqd refused: " + error.message);
        return true;
    }
    return false;
}

export function applyControl(button, note, extraDisabled, extraReason) {
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

export function confirmAction(title, body, action) {
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

function reloadConfig() {
    call("Reload").then(() => say("Reload requested; the outcome follows."), error => {
        if (!denied(error)) say("Reload: " + errorText(error), "error");
    });
}

export function wireSteering() {
    $("#reload-config").addEventListener("click", reloadConfig);
    on("steer", renderGlobalControls);
    renderGlobalControls();
}
