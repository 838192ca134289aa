"""The server's life around uvicorn: the port bound before the model loads (a port in use is an
error in a second, not after a minute of loading); a drain on the first SIGTERM/Ctrl-C that keeps
listening (new requests and /health get 503) until every request held is answered; a second
signal that stops at once, quietly. An engine that fails for good stops the server too (the
command then exits 1, for a supervisor to restart it)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import uvicorn

from launcher.errors import ConfigError
from launcher.serve.server import ServeState

POLL_S = 0.02
LAST_CALLS_S = 0.3
"""After the last request held is answered and the port is closed: time for connections already
accepted to be read and answered (503) before uvicorn closes them."""


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or one error naming serve.port / serve.host."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(
            "serve.host",
            f"{host!r} is not an address here ({exc.strerror}).",
            "serve.host=127.0.0.1.",
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            "serve.port",
            f"cannot listen on {host}:{port} ({exc.strerror}).",
            "pick a free port: serve.port=8001.",
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServeState) -> None:
        super().__init__(config)
        self.state = state
        self.draining = False
        state.worker.on_fatal = self.engine_failed

    def engine_failed(self) -> None:
        """From the engine's thread: /health already names the failure; stop serving."""
        self.state.accepting = False
        self.should_exit = True

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.draining:  # the second signal: at once, and without a traceback per request
            for name in ("uvicorn.error", "uvicorn", "asyncio"):
                logging.getLogger(name).setLevel(logging.CRITICAL + 1)
            self.force_exit = self.should_exit = True
            return
        self.draining = True
        self.state.accepting = False
        threading.Thread(target=self._drain, name="drain", daemon=True).start()

    def _drain(self) -> None:
        engine = self.state.worker.engine
        while (self.state.inflight or engine.pending()) and not self.force_exit:
            time.sleep(POLL_S)
        loop = getattr(self, "loop", None)
        for server in getattr(self, "servers", []):
            if loop is not None:
                loop.call_soon_threadsafe(server.close)
        deadline = time.monotonic() + LAST_CALLS_S
        while time.monotonic() < deadline or self.state.inflight:
            if self.force_exit:
                break
            time.sleep(POLL_S)
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        import asyncio

        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)
