"""The console ETA follows the recent pace of the run, not its average since the start
(issue 17: it said 158 s on a machine that became busy, and the run took 870 s)."""

from __future__ import annotations

import io

import pytest

from launcher.tracking.progress import WINDOW, Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def eta_shown(out: io.StringIO) -> float:
    return float(out.getvalue().splitlines()[-1].rsplit("eta ", 1)[1].rstrip("s"))


def test_eta_follows_a_slowdown_within_the_window() -> None:
    clock, out = FakeClock(), io.StringIO()
    progress = Progress(total=200, every=1, stream=out, clock=clock)
    done = 0
    for _ in range(50):  # a quiet machine: 1 s per step
        clock.now += 1.0
        done += 1
        progress.update(done, 1.0, 100.0)
    assert eta_shown(out) == pytest.approx(150.0)
    for _ in range(WINDOW):  # then the machine gets busy: 6 s per step
        clock.now += 6.0
        done += 1
        progress.update(done, 1.0, 100.0)
    left = 200 - done
    assert eta_shown(out) == pytest.approx(6.0 * left)  # the recent pace only
    average = left * clock.now / done  # what the average since the start would say
    assert average < 0.5 * eta_shown(out)


def test_a_slow_first_step_leaves_the_window() -> None:
    clock, out = FakeClock(), io.StringIO()
    progress = Progress(total=100, every=1, stream=out, clock=clock)
    clock.now = 30.0  # start-up and warm-up in the first step
    progress.update(1, 1.0, 100.0)
    assert eta_shown(out) == pytest.approx(99 * 30.0)  # all we know so far
    for done in range(2, WINDOW + 3):
        clock.now += 0.5
        progress.update(done, 1.0, 100.0)
    assert eta_shown(out) == pytest.approx((100 - (WINDOW + 2)) * 0.5)


def test_a_resumed_run_counts_from_its_first_step() -> None:
    clock, out = FakeClock(), io.StringIO()
    progress = Progress(total=40, every=1, stream=out, clock=clock)
    clock.now = 2.0
    progress.update(21, 1.0, 100.0)  # resumed after step 20: one step in 2 s
    assert eta_shown(out) == pytest.approx(19 * 2.0)


def test_the_compile_time_is_shown_on_the_line_of_the_step_that_compiled() -> None:
    clock, out = FakeClock(), io.StringIO()
    progress = Progress(total=40, every=10, stream=out, clock=clock)
    for step in range(1, 4):
        clock.now = float(step)
        progress.update(step, 1.0, 100.0, compile_s=6.25 if step == 3 else None)
    lines = out.getvalue().splitlines()
    # Step 1 (the first) and step 3 (it compiled), though every=10 shows neither otherwise.
    assert [line.split()[1] for line in lines] == ["1/40", "3/40"]
    assert " compile 6.2s " in lines[1] and "compile" not in lines[0]
