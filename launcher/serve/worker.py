"""The engine on its own thread: HTTP handlers hand it requests and await their results, so the
event loop never blocks on a forward pass."""

from __future__ import annotations

import threading

from launcher.serve.engine import Engine, Request

IDLE_WAIT_S = 0.05


class EngineThread(threading.Thread):
    def __init__(self, engine: Engine) -> None:
        super().__init__(name="generation-engine", daemon=True)
        self.engine = engine
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.error: BaseException | None = None

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
        except BaseException as exc:  # reported by the server; requests held fail, none hangs
            self.error = exc
            held = self.engine.drain_waiting() + list(self.engine.active.values())
            self.engine.active.clear()
            for request in held:
                request.finish_reason = "error"
                if request.on_done is not None:
                    request.on_done(request)
            raise

    def stop(self, timeout: float | None = None) -> None:
        """Finish the requests being decoded, reject those still waiting, then end the thread."""
        for request in self.engine.drain_waiting():
            request.finish_reason = "cancelled"
            if request.on_done is not None:
                request.on_done(request)
        self.stopping.set()
        self.wake.set()
        self.join(timeout)
