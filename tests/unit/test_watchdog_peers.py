"""The watchdog's two multi-node rules: a node whose ranks only wait for a peer waits (briefly)
for another node's watchdog to name the rank, and a rank that already exited is not a hang."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from launcher.events import record_event
from launcher.runners import watchdog
from launcher.runners.watchdog import Rank, _wait_for_blame_elsewhere


def test_the_wait_ends_when_another_node_names_the_rank(tmp_path: Path) -> None:
    threading.Timer(0.5, lambda: record_event(tmp_path, "hang", ranks=[1], hosts=["n2"])).start()
    start = time.monotonic()
    _wait_for_blame_elsewhere(tmp_path, threading.Event())
    assert time.monotonic() - start < watchdog.PEER_WAIT_S / 2


def test_the_wait_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "PEER_WAIT_S", 1.0)
    record_event(tmp_path, "hang", ranks=[], hosts=[])  # this node's own: names no rank
    start = time.monotonic()
    _wait_for_blame_elsewhere(tmp_path, threading.Event())
    assert 0.9 < time.monotonic() - start < 3.0


def test_an_exited_rank_is_dead_not_stopped() -> None:
    child = subprocess.Popen(["true"])
    try:
        proc = psutil.Process(child.pid)
        deadline = time.monotonic() + 10
        while proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)  # exited, not reaped yet: what the agent sees for a moment
        rank = Rank(0, proc, {})
        assert rank.dead and not rank.stopped
    finally:
        child.wait()
