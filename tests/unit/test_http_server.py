"""Request parsing, limits, routing and the bearer token of the HTTP endpoint (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from flexiqd.http.server import (HttpError, Limits, Request, Response, Route, answer, authorised,
                                 json_response, parse_head)


def test_a_plain_get_is_parsed_with_its_query_and_lower_case_headers():
    request = parse_head(b"GET /api/scaler?queue=mail%20out&pool= HTTP/1.1\r\nHost: x\r\nX-Thing:  a b \r\n")
    assert request == Request("GET", "/api/scaler", {"queue": "mail out", "pool": ""},
                              {"host": "x", "x-thing": "a b"})


@pytest.mark.parametrize("head, status", [
    (b"GET /metrics", 400),                                   # no version
    (b"GET  /metrics HTTP/1.1", 400),                         # two spaces
    (b"get /metrics HTTP/1.1", 400),                          # lower-case method
    (b"GET metrics HTTP/1.1", 400),                           # not a path
    (b"GET /metrics SPDY/3", 400),
    (b"\xff\xfe /metrics HTTP/1.1", 400),                     # not ASCII
    (b"GET /metrics HTTP/1.1\r\nno colon here", 400),
    (b"GET /metrics HTTP/1.1\r\nBad Name: x", 400),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: 5", 413),
    (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked", 413),
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1", 414),
    (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 65, 431),
    (b"GET / HTTP/1.1\r\nX: " + b"y" * 17000, 431),
    (b"GET /?" + b"&".join(b"k%d=v" % i for i in range(20)) + b" HTTP/1.1", 400),
])
def test_bad_requests_get_the_right_4xx(head, status):
    with pytest.raises(HttpError) as caught:
        parse_head(head, Limits())
    assert caught.value.status == status
    assert caught.value.message and "\n" not in caught.value.message


def test_an_empty_content_length_is_no_body():
    assert parse_head(b"GET / HTTP/1.0\r\nContent-Length: 0").path == "/"


ROUTES = {"/ok": Route(lambda r: json_response({"ok": True})),
          "/health": Route(lambda r: json_response({"status": "ok"}), public=True)}


def request(path="/ok", method="GET", **headers):
    return Request(method, path, {}, {k.lower(): v for k, v in headers.items()})


def run(coro):
    return asyncio.run(coro)


def status_of(req, token=None):
    try:
        return run(answer(req, ROUTES, token)).status
    except HttpError as exc:
        return exc.status


def test_routing_methods_and_unknown_paths():
    assert status_of(request()) == 200
    assert status_of(request(method="HEAD")) == 200
    assert status_of(request("/nope")) == 404
    assert status_of(request(method="POST")) == 405
    assert status_of(request(method="DELETE", path="/health")) == 405


def test_a_405_says_which_methods_are_allowed():
    with pytest.raises(HttpError) as caught:
        run(answer(request(method="PUT"), ROUTES, None))
    assert ("Allow", "GET, HEAD") in caught.value.headers


@pytest.mark.parametrize("header, status", [
    (None, 401), ("Bearer wrong", 401), ("Basic c2VjcmV0", 401), ("Bearer", 401),
    ("Bearer secret", 200), ("bearer secret", 200), ("Bearer secret ", 200),
])
def test_the_bearer_token_guards_every_route_but_health(header, status):
    headers = {"Authorization": header} if header is not None else {}
    assert status_of(request(**headers), token=b"secret") == status
    assert status_of(request("/health", **headers), token=b"secret") == 200


def test_no_token_configured_means_no_check():
    assert authorised(request(Authorization="Bearer anything"), None)
    assert authorised(request(), None)


def test_an_async_handler_is_awaited():
    async def handler(req):
        return Response(200, b"x", "text/plain")

    assert run(answer(request("/a"), {"/a": Route(handler)}, None)).body == b"x"
