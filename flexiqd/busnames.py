"""The names of flexiqd's D-Bus API, shared by the daemon and flexiqctl (no imports: cheap to load).

docs/dbus-api.md describes every member.  These names are a contract: keep them stable.
"""

BUS_NAME = "org.flexiq.flexiqd1"
OBJECT_PATH = "/org/flexiq/flexiqd1"
INTERFACE = "org.flexiq.flexiqd1.Manager"

# Each configured pool is an object of its own below the manager, as systemd exposes each unit.
POOL_INTERFACE = "org.flexiq.flexiqd1.Pool"
POOL_PATH_PREFIX = OBJECT_PATH + "/pool/"


def pool_path(pool: str) -> str:
    """``/org/flexiq/flexiqd1/pool/<pool>``: pool names (``[a-z0-9_]+``) are valid path elements as they are."""
    return POOL_PATH_PREFIX + pool


def pool_from_path(path: str) -> str | None:
    """The pool a pool object's path names; None for any other path."""
    if not path.startswith(POOL_PATH_PREFIX):
        return None
    name = path[len(POOL_PATH_PREFIX):]
    return name if name and "/" not in name else None


# Signals of the Manager interface.
SIGNAL_SCALE_EVENT = "ScaleEvent"           # (s pool, u from, u to, s reason, t seq)
SIGNAL_CONFIG_RELOADED = "ConfigReloaded"   # (b ok, s message)

# The standard interfaces flexiqd's objects implement besides their own.
PROPERTIES_INTERFACE = "org.freedesktop.DBus.Properties"
OBJECT_MANAGER_INTERFACE = "org.freedesktop.DBus.ObjectManager"

# The bus itself (asked for a caller's credentials, told which signals to deliver).
DBUS_NAME = "org.freedesktop.DBus"
DBUS_PATH = "/org/freedesktop/DBus"
DBUS_INTERFACE = "org.freedesktop.DBus"

# Where the system bus listens when $DBUS_SYSTEM_BUS_ADDRESS is unset (as sd-bus and dbus-fast default).
DEFAULT_SYSTEM_BUS = "unix:path=/run/dbus/system_bus_socket"

# The steering role: the group whose members may steer flexiqd and read the jobs over D-Bus
# (besides root).  Not the group ``flexiq``, which the workers and the daemon share the queue
# with and which job producers join to enqueue (docs/security.md).
OPERATOR_GROUP = "flexiq-admin"

# Error names the daemon replies with.
ERROR_INVALID_ARGS = "org.flexiq.flexiqd1.Error.InvalidArgs"   # unknown pool, count out of range, ...
ERROR_FAILED = "org.flexiq.flexiqd1.Error.Failed"              # the request was valid but could not be done
ERROR_ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied"

# Error names the bus (or a peer) replies with, as flexiqctl reports them.
ERROR_SERVICE_UNKNOWN = "org.freedesktop.DBus.Error.ServiceUnknown"
ERROR_NAME_HAS_NO_OWNER = "org.freedesktop.DBus.Error.NameHasNoOwner"
ERROR_DISCONNECTED = "org.freedesktop.DBus.Error.Disconnected"
ERROR_NO_REPLY = "org.freedesktop.DBus.Error.NoReply"
ERROR_TIMEOUT = "org.freedesktop.DBus.Error.Timeout"
ERROR_UNKNOWN_METHOD = "org.freedesktop.DBus.Error.UnknownMethod"
ERROR_UNKNOWN_OBJECT = "org.freedesktop.DBus.Error.UnknownObject"
ERROR_UNKNOWN_INTERFACE = "org.freedesktop.DBus.Error.UnknownInterface"
