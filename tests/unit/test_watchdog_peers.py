"""The watchdog's two multi-node rules: a node whose ranks only wait for a peer waits (briefly)
for another node's watchdog to name the rank, and a rank that already exited is not a hang.

The wait is measured by the watchdog's own clock, given here: a clock that moves one second per
look, so the tests count looks instead of timing them."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from launcher.events import record_event
from launcher.runners import watchdog
from launcher.runners.watchdog import Rank, _wait_for_blame_elsewhere


class Looks:
    """A clock one second further at each look; `at_look` runs once, at that look."""

    def __init__(self, at_look: int = 0, then: Callable[[], object] = lambda: None) -> None:
        self.count, self.at_look, self.then = 0, at_look, then

    def __call__(self) -> float:
        self.count += 1
        if self.count == self.at_look:
            self.then()
        return float(self.count)


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "PEER_POLL_S", 0.01)


def test_the_wait_ends_when_another_node_names_the_rank(tmp_path: Path) -> None:
    clock = Looks(3, lambda: record_event(tmp_path, "hang", ranks=[1], hosts=["n2"]))
    assert _wait_for_blame_elsewhere(tmp_path, threading.Event(), clock)
    # Named at the third look: the wait ended there, not at PEER_WAIT_S (10 looks).
    assert clock.count == 3 < watchdog.PEER_WAIT_S


def test_the_wait_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "PEER_WAIT_S", 4.0)
    record_event(tmp_path, "hang", ranks=[], hosts=[])  # this node's own: names no rank
    clock = Looks()
    assert not _wait_for_blame_elsewhere(tmp_path, threading.Event(), clock)
    # The deadline (look 1 + 4 s), then looks at 2, 3, 4 s, and the one at 5 s that ends it.
    assert clock.count == 5


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


def test_a_node_whose_ranks_wait_names_another_nodes_late_rank(tmp_path: Path) -> None:
    """A node frozen whole (SIGSTOP) has no watchdog to name its rank; the shared heartbeats do."""
    beats = tmp_path / "heartbeats"
    beats.mkdir()
    now, started = time.time(), psutil.Process().create_time()  # this attempt's start
    records = {
        0: {"host": "node-b", "step": 9, "time": started - 1, "deadline": now - 5},  # before
        1: {"host": "node-b", "step": 5, "time": started + 0.01, "deadline": now - 0.01},  # late
        2: {"host": "node-b", "step": 6, "time": now - 1, "deadline": now + 14},  # in time
        3: {"host": "node-b", "step": 6, "time": now - 1, "deadline": None},  # ended
    }
    for rank, beat in records.items():
        (beats / f"rank{rank}.json").write_text(json.dumps({"rank": rank, **beat}))
    mine = Rank(4, psutil.Process(), {"rank": 4, "host": "node-a"})
    assert watchdog.late_elsewhere(tmp_path, [mine]) == ": rank 1 on node-b (last at step 5)"
    (beats / "rank1.json").unlink()
    assert watchdog.late_elsewhere(tmp_path, [mine]) == ""


@pytest.mark.parametrize(("named_in", "expected"), [("this attempt", []), ("the last one", [0])])
def test_a_rank_failing_after_another_node_named_the_hang_is_not_named_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named_in: str, expected: list[int]
) -> None:
    """Another node's watchdog named (and killed) rank 1; this node's rank 0, one of two ranks in
    all, was slow to fail with its peer gone when this node's own deadline passed: the record
    this node writes names no rank, so the job's hang stays rank 1's. A record of an earlier
    attempt (before these ranks started) does not count."""
    monkeypatch.setattr(watchdog, "DUMP_WAIT_S", 0.2)
    named = record_event(tmp_path, "hang", ranks=[1], hosts=["node-b"])
    # When these ranks started (a process's start time is read to the second: set it here).
    started = float(named["time"]) + (1 if named_in == "the last one" else -1)
    monkeypatch.setattr(watchdog, "attempt_started", lambda ranks: started)
    child = subprocess.Popen(  # alive through the stack dump's signal, as a rank is
        ["bash", "-c", "trap '' USR2; echo ready; exec sleep 30"],
        env={"RANK": "0", "WORLD_SIZE": "2", "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        beat = {"rank": 0, "host": "node-a", "timeout": 4, "time": time.time(), "step": 5}
        mine = Rank(0, psutil.Process(child.pid), beat)
        found = watchdog.Watchdog(tmp_path)
        found.fire([mine])
        assert [hang["ranks"] for hang in found.hangs] == [expected]
    finally:
        child.kill()
        child.wait()
