"""The server's read timeouts on a real uvicorn server and real sockets (issue 33): a connection
that sends nothing, or its headers a byte at a time, is closed at serve.header_timeout_seconds; a
body that does not arrive in serve.body_timeout_seconds is a 408 that closes the connection; a
kept-alive connection idle between requests is not cut by the header deadline."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytest.importorskip("fastapi")

from launcher.config.serve import ServeConfig
from launcher.errors import ConfigError
from tests.serve_app import real_server as serving_for_real
from tests.serve_app import tiny_state

DEADLINE_S = 0.5
GIVE_UP_S = 30.0
"""How long a test waits for the server before failing (never reached when the bound holds)."""


@contextmanager
def real_server() -> Iterator[int]:
    state = tiny_state(1, 1, header_timeout_seconds=DEADLINE_S, body_timeout_seconds=DEADLINE_S)
    with serving_for_real(state) as (_server, _thread, port):
        yield port


def _connect(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port))
    conn.settimeout(GIVE_UP_S)
    return conn


def _until_closed(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    got = b""
    try:
        while chunk := conn.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def _response(conn: socket.socket) -> bytes:
    """One whole response (headers and its Content-Length of body)."""
    got = b""
    while b"\r\n\r\n" not in got:
        got += conn.recv(65536)
    head, _, body = got.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def test_silent_and_slow_headers_are_closed() -> None:
    request = b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n" + b"X-Pad: y\r\n" * 60
    with real_server() as port:
        silent = _connect(port)
        slow = _connect(port)
        sent = 0
        try:
            while sent < len(request):  # a byte every 50 ms: 30 s for the whole header block
                slow.sendall(request[sent : sent + 1])
                sent += 1
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert _until_closed(slow) == b"" and sent < len(request)
        assert _until_closed(silent) == b""


def test_a_slow_body_is_408_and_closed() -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
    with real_server() as port:
        conn = _connect(port)
        conn.sendall(head + b'Content-Length: 100\r\n\r\n{"prompt"')
        reply = _until_closed(conn)
    assert reply.startswith(b"HTTP/1.1 408 "), reply
    assert b"connection: close" in reply.lower() and b"serve.body_timeout_seconds" in reply


def test_a_kept_alive_connection_outlives_the_header_deadline() -> None:
    ask = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"
    with real_server() as port:
        conn = _connect(port)
        replies = []
        for _ in range(2):
            conn.sendall(ask)
            replies.append(_response(conn))
            time.sleep(3 * DEADLINE_S)  # idle, under serve.keep_alive_seconds (5)
        conn.close()
    assert all(r.startswith(b"HTTP/1.1 200 ") and r.endswith(b"}") for r in replies), replies


@pytest.mark.parametrize(
    "key", ["header_timeout_seconds", "body_timeout_seconds", "keep_alive_seconds"]
)
def test_timeouts_are_validated(key: str) -> None:
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ConfigError) as refused:
            ServeConfig(**{key: bad})  # type: ignore[arg-type]
        assert f"serve.{key}" in str(refused.value)
