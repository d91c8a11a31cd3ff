"""A small HTTP/1.1 server on asyncio: GET and HEAD, one request per connection.

It only answers from what it is handed (a route table); it never reads the store
or waits on the daemon, and every connection is bounded so no client can hold it:

- the request head (request line and headers) is read within ``Limits.head_timeout``
  (slowloris: 408), at most ``Limits.request_line`` bytes of request line (414) and
  ``Limits.head`` bytes in all (431);
- a request with a body gets 413, a method other than GET/HEAD 405, a malformed
  request 400, an unknown path 404, a missing or wrong bearer token 401;
- at most ``Limits.connections`` connections at once: the next ones get 503 at once;
- the answer is written within ``Limits.write_timeout``, then the connection is closed.

Thread-safety: runs on one event loop; handlers are called on it and must not block.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import inspect
import json
import logging
import urllib.parse
from typing import Awaitable, Callable, Mapping, Union

from ..errors import FlexiqdError

log = logging.getLogger(__name__)

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 413: "Content Too Large",
           414: "URI Too Long", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}
JSON = "application/json"


@dataclasses.dataclass(frozen=True)
class Limits:
    request_line: int = 4096
    head: int = 16384
    headers: int = 64
    head_timeout: float = 5.0
    write_timeout: float = 10.0
    connections: int = 32


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]     # names in lower case


@dataclasses.dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()


class HttpError(Exception):
    """A request answered with a 4xx: ``status`` and a one-line ``message``."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def json_response(document: object, status: int = 200) -> Response:
    return Response(status, (json.dumps(document, sort_keys=True) + "\n").encode())


def error_response(error: HttpError) -> Response:
    return Response(error.status, (json.dumps({"error": error.message}) + "\n").encode(),
                    headers=error.headers)


def parse_head(head: bytes, limits: Limits = Limits()) -> Request:
    """The request in ``head`` (request line and headers, without the blank line).  Pure."""
    lines = head.split(b"\r\n") if b"\r\n" in head else head.split(b"\n")
    request_line = lines[0]
    if len(request_line) > limits.request_line:
        raise HttpError(414, f"request line longer than {limits.request_line} bytes")
    if len(head) > limits.head:
        raise HttpError(431, f"request head longer than {limits.head} bytes")
    try:
        method, target, version = request_line.decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError):
        raise HttpError(400, "malformed request line") from None
    if not version.startswith("HTTP/1.") or not method.isalpha() or not method.isupper():
        raise HttpError(400, "malformed request line")
    if not target.startswith("/"):
        raise HttpError(400, "the request target must be a path")
    if len(lines) - 1 > limits.headers:
        raise HttpError(431, f"more than {limits.headers} header fields")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or b" " in name:
            raise HttpError(400, "malformed header field")
        try:
            headers[name.decode("ascii").lower()] = value.strip().decode("latin-1")
        except UnicodeDecodeError:
            raise HttpError(400, "malformed header field name") from None
    if headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers:
        raise HttpError(413, "requests with a body are not accepted")
    parts = urllib.parse.urlsplit(target)
    try:
        query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False,
                                            max_num_fields=16))
    except ValueError:
        raise HttpError(400, "too many query parameters") from None
    return Request(method=method, path=urllib.parse.unquote(parts.path), query=query, headers=headers)


Handler = Callable[[Request], Union[Response, Awaitable[Response]]]


@dataclasses.dataclass(frozen=True)
class Route:
    handler: Handler
    public: bool = False         # answered without the token (/health)


def authorised(request: Request, token: bytes | None) -> bool:
    """True when no token is set or the request carries it as ``Authorization: Bearer``."""
    if token is None:
        return True
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("latin-1", "replace"), token)


async def answer(request: Request, routes: Mapping[str, Route], token: bytes | None) -> Response:
    """The response to a parsed request: routing, method and token checks, then the handler."""
    route = routes.get(request.path)
    if route is None:
        raise HttpError(404, "not found")
    if request.method not in ("GET", "HEAD"):
        raise HttpError(405, f"method {request.method} not allowed", (("Allow", "GET, HEAD"),))
    if not route.public and not authorised(request, token):
        raise HttpError(401, "a valid bearer token is required", (("WWW-Authenticate", "Bearer"),))
    response = route.handler(request)
    if inspect.isawaitable(response):
        response = await response
    return response


class HttpServer:
    """Serves ``routes`` on ``host:port``.  ``start`` raises ``FlexiqdError`` when it cannot listen."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Route], *, token: bytes | None = None,
                 limits: Limits = Limits()) -> None:
        self.host, self.port = host, port
        self.routes = routes
        self.token = token
        self.limits = limits
        self._server: asyncio.AbstractServer | None = None
        self._open = 0
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._connection, self.host, self.port,
                                                      limit=self.limits.head + 1024)
        except OSError as exc:
            raise FlexiqdError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and end the connections still open.  Idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._open += 1
        try:
            if self._open > self.limits.connections:
                await self._send(writer, "GET", error_response(HttpError(503, "too many connections")))
                return
            method = "GET"
            try:
                head = await asyncio.wait_for(self._read_head(reader), self.limits.head_timeout)
                request = parse_head(head, self.limits)
                method = request.method
                response = await answer(request, self.routes, self.token)
            except asyncio.TimeoutError:
                response = error_response(HttpError(408, "the request head did not arrive in time"))
            except HttpError as exc:
                response = error_response(exc)
            except (ConnectionError, asyncio.IncompleteReadError):
                return
            except Exception:  # a renderer's bug must answer 500, not end the server
                log.exception("The HTTP endpoint failed to answer a request.")
                response = error_response(HttpError(500, "internal error"))
            await self._send(writer, method, response)
        finally:
            self._open -= 1
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _read_head(self, reader: asyncio.StreamReader) -> bytes:
        """Bytes up to the blank line after the headers, within the size limits."""
        data = b""
        while True:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                end = data.find(b"\n\n")
            if end >= 0:
                return data[:end]
            first_line = data.split(b"\n", 1)[0]
            if len(first_line) > self.limits.request_line:
                raise HttpError(414, f"request line longer than {self.limits.request_line} bytes")
            if len(data) > self.limits.head:
                raise HttpError(431, f"request head longer than {self.limits.head} bytes")
            chunk = await reader.read(4096)
            if not chunk:
                if not data:
                    raise ConnectionError("closed before a request")
                raise HttpError(400, "the request head ended early")
            data += chunk

    async def _send(self, writer: asyncio.StreamWriter, method: str, response: Response) -> None:
        head = [f"HTTP/1.1 {response.status} {REASONS.get(response.status, '')}",
                f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}",
                "Connection: close", *(f"{name}: {value}" for name, value in response.headers)]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD":
            writer.write(response.body)
        try:
            await asyncio.wait_for(writer.drain(), self.limits.write_timeout)
        except (asyncio.TimeoutError, ConnectionError):
            pass
