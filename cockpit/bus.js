/*
 * flexiqd's D-Bus API as the logged-in user sees it: one cockpit.dbus client on the system
 * bus, so the bus policy and the daemon decide what this user may do (docs/dbus-api.md).
 */

const BUS_NAME = "org.flexiq.flexiqd1";
export const MANAGER_PATH = "/org/flexiq/flexiqd1";
export const MANAGER = "org.flexiq.flexiqd1.Manager";
export const POOL = "org.flexiq.flexiqd1.Pool";
export const ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied";
const UNKNOWN_METHOD = "org.freedesktop.DBus.Error.UnknownMethod";
export const NOT_RUNNING = ["org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner"];

export const client = cockpit.dbus(BUS_NAME, { bus: "system" });

export function call(method, args) {
    return client.call(MANAGER_PATH, MANAGER, method, args || []);
}

export function isMissing(error) {
    return error && error.name === UNKNOWN_METHOD;
}

export function errorText(error) {
    if (!error) return "unknown error";
    if (NOT_RUNNING.includes(error.name)) return "flexiqd is not running (systemctl start flexiqd)";
    return error.message || cockpit.message(error);
}

export function missingText(method) {
    return "This flexiqd has no " + method + " method on D-Bus (it is older than this page); update flexiqd to see this.";
}
