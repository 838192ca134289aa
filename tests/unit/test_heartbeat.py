"""The heartbeat costs one file write per healthy step, and what it writes keeps the watchdog's
deadlines right: none during warm-up and saves, now + hang_timeout otherwise."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.worker.heartbeat import Heartbeat


class CountingHeartbeat(Heartbeat):
    writes = 0

    def beat(self, step: int, phase: str, timed: bool = True) -> None:
        self.writes += 1
        super().beat(step, phase, timed)


def read_beat(heartbeat: Heartbeat) -> dict:
    return json.loads(heartbeat.path.read_text())


def test_one_write_per_step_and_untimed_saves(tmp_path: Path) -> None:
    heartbeat = CountingHeartbeat(tmp_path, 0, 60.0, saves_after=lambda step: step == 4)
    heartbeat.before_step(1)
    assert read_beat(heartbeat)["deadline"] is None  # warm-up: the first step is not timed
    heartbeat.after_step(1)
    start = heartbeat.writes
    for step in (2, 3):
        heartbeat.before_step(step)
        heartbeat.after_step(step)
    assert heartbeat.writes - start == 2  # one per step
    beat = read_beat(heartbeat)
    assert beat["step"] == 3 and beat["deadline"] - beat["time"] == 60.0

    heartbeat.before_step(4)
    heartbeat.after_step(4)  # a checkpoint follows: not timed
    assert read_beat(heartbeat)["deadline"] is None and read_beat(heartbeat)["phase"] == "save"
    before = heartbeat.writes
    heartbeat.before_step(5)  # timed again once the save is over
    assert heartbeat.writes == before + 1 and read_beat(heartbeat)["deadline"] is not None
