"""How long `launch serve` waits for a client: the request's headers (serve.header_timeout_seconds,
from the connection's first byte or its opening), its body (serve.body_timeout_seconds, in
body.py) and an idle kept-alive connection (serve.keep_alive_seconds, uvicorn's own setting).

uvicorn bounds the size of the headers (h11: 16 KiB) and the idle time between requests, but not
the time the headers take: a client that sends one byte a second, or opens a connection and sends
nothing, is held as long as it likes. `header_deadline` adds that bound to uvicorn's HTTP protocol
(h11 or httptools, whichever uvicorn would choose): the connection is closed when a request's
headers are not complete in time."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from launcher.config.serve import ServeConfig


class _HeaderDeadline:
    """Mixed in before uvicorn's protocol class: a timer runs while the connection waits for a
    request's headers (armed when it opens, and by the first bytes of each later request)."""

    header_timeout: float = 20.0
    cycle: Any
    transport: asyncio.Transport
    _deadline: asyncio.TimerHandle | None = None

    def _between_requests(self) -> bool:
        return self.cycle is None or bool(self.cycle.response_complete)

    def _arm(self) -> None:
        if self._deadline is None:
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        if self._between_requests():
            self._arm()  # part of a request's headers (or bytes the parser holds)
        else:
            self._disarm()  # the headers are in: the handler reads the body, with its own bound

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]


def header_deadline(seconds: float, base: type[asyncio.Protocol] = AutoHTTPProtocol) -> type:
    """uvicorn's HTTP protocol class with a deadline on each request's headers."""
    name = f"HeaderDeadline{base.__name__}"
    return type(name, (_HeaderDeadline, base), {"header_timeout": seconds})


def uvicorn_config(app: Any, serve: ServeConfig) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        log_level="warning",
        http=header_deadline(serve.header_timeout_seconds),
        timeout_keep_alive=serve.keep_alive_seconds,  # type: ignore[arg-type]
    )
