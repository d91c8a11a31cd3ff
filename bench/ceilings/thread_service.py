"""An HTTP service with exactly N handler threads: the ``threads`` ceiling.

    python thread_service.py --threads N [--port P]

N threads each ``accept()`` on one listening socket and serve one connection at a time:
``GET /work?ms=50`` blocks its thread ``ms`` milliseconds in ``time.sleep`` (as a handler
waiting on its own backend would), then answers ``200 ok``.  Connections beyond the N
being served wait in the kernel's accept backlog (4096 here), so the service never
refuses work; it only makes it wait.  Prints ``port <P>`` on stdout once it listens;
runs until SIGTERM.  ``GET /stats`` answers how many requests were served and the most
handled at once (it takes one of the N threads too, so the harness reads it only at rest).
"""

from __future__ import annotations

import argparse
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


def _serve(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # the listener was closed: shutting down
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
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    listener = socket.create_server(("127.0.0.1", args.port), backlog=4096)
    for n in range(args.threads):
        threading.Thread(target=_serve, args=(listener,), name=f"handler-{n}", daemon=True).start()
    print(f"port {listener.getsockname()[1]}", flush=True)
    while not stop.wait(0.5):
        pass
    listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
