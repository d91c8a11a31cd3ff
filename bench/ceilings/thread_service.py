"""An HTTP service with exactly N handler threads: the ``threads`` ceiling.

    python thread_service.py --threads N [--port P] [--unix PATH]

N threads each ``accept()`` on one listening socket and serve one connection at a time:
``GET /work?ms=50`` blocks its thread ``ms`` milliseconds in ``time.sleep`` (as a handler
waiting on its own backend would), then answers ``200 ok``.  Connections beyond the N
being served wait in the kernel's accept backlog (4096 here), so the service never
refuses work; it only makes it wait.  With ``--unix PATH`` it also listens on a unix socket
there (for clients in a container of their own network, such as the systemd sandbox's
workers); the same N threads serve both listeners.  Prints ``port <P>`` on stdout once it listens;
runs until SIGTERM.  ``GET /stats`` answers how many requests were served and the most
handled at once (it takes one of the N threads too, so the harness reads it only at rest).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

_lock = threading.Lock()
_served = 0
_busy = 0
_most_busy = 0


def _respond(conn: socket.socket, status: str, body: bytes) -> None:
    conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                 "Connection: close\r\n\r\n".encode() + body)


def _handle(conn: socket.socket) -> None:
    global _served, _busy, _most_busy
    conn.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk
        if len(data) > 65536:
            return
    try:
        _method, target, _version = data.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
    except ValueError:
        _respond(conn, "400 Bad Request", b"bad request\n")
        return
    url = urlsplit(target)
    if url.path == "/stats":
        with _lock:
            body = f"served {_served} most_busy {_most_busy}\n".encode()
        _respond(conn, "200 OK", body)
        return
    if url.path != "/work":
        _respond(conn, "404 Not Found", b"not found\n")
        return
    ms = float(parse_qs(url.query).get("ms", ["50"])[0])
    with _lock:
        _busy += 1
        _most_busy = max(_most_busy, _busy)
    try:
        time.sleep(ms / 1000.0)
    finally:
        with _lock:
            _busy -= 1
            _served += 1
    _respond(conn, "200 OK", b"ok\n")


def _accept(listeners: list[socket.socket]) -> socket.socket | None:
    """The next connection on any listener (blocking); None once they are closed."""
    if len(listeners) == 1:
        try:
            return listeners[0].accept()[0]
        except OSError:
            return None  # the listener was closed: shutting down
    while True:
        try:
            ready, _, _ = select.select(listeners, [], [], 1.0)
        except (OSError, ValueError):
            return None
        for listener in ready:
            try:
                conn = listener.accept()[0]   # non-blocking: another thread may have taken it
            except BlockingIOError:
                continue
            except OSError:
                return None
            conn.setblocking(True)
            return conn


def _serve(listeners: list[socket.socket]) -> None:
    while True:
        conn = _accept(listeners)
        if conn is None:
            return
        try:
            _handle(conn)
        except OSError:
            pass  # the client went away
        finally:
            conn.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--unix", help="also listen on a unix socket at this path")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    listener = socket.create_server(("127.0.0.1", args.port), backlog=4096)
    listeners = [listener]
    if args.unix:
        local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        local.bind(args.unix)
        os.chmod(args.unix, 0o777)   # a container's workers run as another user
        local.listen(4096)
        listeners.append(local)
        for each in listeners:
            each.setblocking(False)
    for n in range(args.threads):
        threading.Thread(target=_serve, args=(listeners,), name=f"handler-{n}", daemon=True).start()
    print(f"port {listener.getsockname()[1]}", flush=True)
    while not stop.wait(0.5):
        pass
    for each in listeners:
        each.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
