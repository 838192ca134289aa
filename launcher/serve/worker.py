"""The engine on its own thread: HTTP handlers hand it requests and await their results, so the
event loop never blocks on a forward pass.

A request that fails inside a step fails alone (engine.py) and the thread goes on. When the engine
cannot go on (EngineBroken, or a failure outside a step), `error` is set, every request it holds
fails with the reason, and `on_fatal` is called: the server then reports the failure on /health
and exits non-zero so that its supervisor restarts it."""

from __future__ import annotations

import threading
from collections.abc import Callable

from launcher.logs import get_logger
from launcher.serve.engine import Engine, Request

IDLE_WAIT_S = 0.05


class EngineThread(threading.Thread):
    def __init__(self, engine: Engine) -> None:
        super().__init__(name="generation-engine", daemon=True)
        self.engine = engine
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.on_fatal: Callable[[], None] | None = None
        """Called (on this thread) once the engine has failed for good."""

    def submit(self, request: Request) -> Request:
        """Queue a request (raises QueueFull at the bound) and wake the engine."""
        self.engine.submit(request)
        self.wake.set()
        return request

    def run(self) -> None:
        try:
            while True:
                if self.engine.pending():
                    self.engine.step()
                    continue
                if self.stopping.is_set():
                    return
                self.wake.wait(IDLE_WAIT_S)
                self.wake.clear()
        except BaseException as exc:  # requests held fail with the reason, none hangs
            self.error = exc
            why = f"the engine failed: {type(exc).__name__}: {exc}"
            get_logger().error(why, exc_info=exc)
            held = self.engine.drain_waiting() + list(self.engine.active.values())
            self.engine.active.clear()
            for request in held:
                request.finish_reason, request.error = "error", why
                if request.on_done is not None:
                    request.on_done(request)
            if self.on_fatal is not None:
                self.on_fatal()

    def stop(self, timeout: float | None = None) -> None:
        """Finish the requests being decoded, reject those still waiting, then end the thread."""
        for request in self.engine.drain_waiting():
            request.finish_reason = "cancelled"
            if request.on_done is not None:
                request.on_done(request)
        self.stopping.set()
        self.wake.set()
        self.join(timeout)
