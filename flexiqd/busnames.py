"""The names of flexiqd's D-Bus API, shared by the daemon and flexiqctl (no imports: cheap to load).

docs/dbus-api.md describes every member.  These names are a contract: keep them stable.
"""

BUS_NAME = "org.flexiq.flexiqd1"
OBJECT_PATH = "/org/flexiq/flexiqd1"
INTERFACE = "org.flexiq.flexiqd1.Manager"

# The group whose members may steer flexiqd (besides root).
OPERATOR_GROUP = "flexiq"

# Error names the daemon replies with.
ERROR_INVALID_ARGS = "org.flexiq.flexiqd1.Error.InvalidArgs"   # unknown pool, count out of range, ...
ERROR_FAILED = "org.flexiq.flexiqd1.Error.Failed"              # the request was valid but could not be done
ERROR_ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied"
