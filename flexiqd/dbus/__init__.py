"""The daemon's D-Bus face: ``org.flexiq.flexiqd1`` on the system bus (docs/dbus-api.md).

It sees the daemon only through ``daemon.api_port.ApiPort``, as the HTTP face
(``flexiqd.http``) does.
"""
