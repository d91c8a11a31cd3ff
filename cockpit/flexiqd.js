/*
 * flexiqd's Cockpit page (docs/cockpit.md): the entry module, which starts the parts.
 *
 * Everything comes from flexiqd's D-Bus API, called as the logged-in user through
 * cockpit.dbus, so the bus policy and the daemon decide what this user may do: the
 * page cannot give anyone more than flexiqctl gives them.
 *
 * Live, from signals: each pool object's PropertiesChanged (after every tick) updates
 * its card and appends a point to its charts; ObjectManager's InterfacesAdded/Removed
 * add and remove cards; ScaleEvent marks a decision on the charts.  The Status document
 * (dependencies, machines, held-back jobs) and the Schedules document are read again
 * after ticks, at most every 2 s.  Nothing polls: the only timers coalesce the redraws
 * and reads that signals asked for.
 *
 * Methods a daemon may not have yet (History, Jobs, Job, RetryDead, PurgeDead,
 * Schedules) are tried, and the section that needs one says so when it is missing.
 *
 * The parts, one module each (native ES modules, no build step):
 *   format.js     words, numbers and small DOM helpers
 *   bus.js        the D-Bus client and its errors
 *   page.js       the one state, the events between parts, the message box
 *   steering.js   who may steer, the controls' state, confirmations, Reload
 *   pools.js      the pool table and cards, their history, decisions and fires
 *   charts.js     a pool's charts (libjs-dygraphs)
 *   status.js     the daemon's line, dependencies, held-back jobs, machines
 *   schedules.js  the schedules, Run now / Pause / Resume
 *   jobs.js       the jobs, a job's details, the dead letters
 */

import { $ } from "./format.js";
import { NOT_RUNNING, errorText } from "./bus.js";
import { state } from "./page.js";
import { initAccess, wireSteering } from "./steering.js";
import { wirePools, watchPools, watchSignals } from "./pools.js";
import { loadStatus, watchManager, wireStatus } from "./status.js";
import { loadSchedules, wireSchedules } from "./schedules.js";
import { wireJobs } from "./jobs.js";

performance.mark("flexiqd:start");

function start() {
    wirePools();
    wireJobs();
    wireStatus();
    wireSchedules();
    watchSignals();
    wireSteering();
    const access = initAccess();
    const ready = Promise.all([watchManager(), watchPools(), loadStatus(), access]);
    loadSchedules();
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
