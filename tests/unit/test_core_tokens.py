"""The suite's own scheduler (tests/cores.py, tests/once.py): core tokens shared by xdist workers,
and directories built once for all of them. Each `Cores` here stands for one worker (flock locks
belong to an open file, so two in one process exclude each other as two processes would)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cores import TOKENS_PER_CORE, Cores, at_least, cores, ranks_started_by
from tests.once import built_once


@pytest.mark.parametrize(
    ("args", "ranks"),
    [
        (["train", "parallel.dp=2"], 2),
        (["train", "+parallel.dp=3"], 3),
        (["train", "parallel.dp=1,2", "--multirun"], 2),  # a sweep's points run one at a time
        (["verify", "parallel.dp=2"], 2),
        (["train", "parallel.dp=2", "parallel.tp=2", "parallel.pp=2"], 8),  # dp x tp x pp
        (["train"], 1),
        (["plan", "parallel.dp=64"], 1),  # plans start nothing
        (["train", "cluster=slurm", "parallel.dp=2"], 1),  # the cluster's jobs run the ranks
        (["train", "parallel.dp=two"], 1),  # refused before anything starts
    ],
)
def test_ranks_started_by_a_launch(args: list[str], ranks: int) -> None:
    assert ranks_started_by(args) == ranks


def _in_thread(action: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def test_one_token_tests_share_and_a_two_token_test_waits_for_both(tmp_path: Path) -> None:
    first, second, ranks = Cores(tmp_path, 2), Cores(tmp_path, 2), Cores(tmp_path, 2)
    first.take(1)
    second.take(1)
    assert len(first.held) == len(second.held) == 1
    waiter = _in_thread(lambda: ranks.take(2))
    time.sleep(0.3)
    assert waiter.is_alive() and not ranks.held, "took a core another worker holds"
    first.release()
    time.sleep(0.3)
    assert waiter.is_alive(), "took two tokens while one was still held"
    # A one-token test asking now waits behind the two-token one (no starvation).
    late = Cores(tmp_path, 2)
    asker = _in_thread(lambda: late.take(1))
    second.release()
    waiter.join(10)
    assert len(ranks.held) == 2
    time.sleep(0.3)
    assert asker.is_alive() and not late.held
    ranks.release()
    asker.join(10)
    assert len(late.held) == 1


def test_a_two_token_test_takes_whichever_are_free(tmp_path: Path) -> None:
    """A long one-token test on the first token does not hold up a launch while others are free
    (they were once taken in order, so it waited for that one, holding the gate)."""
    long_test, launch = Cores(tmp_path, 3), Cores(tmp_path, 3)
    long_test.take(1)
    taker = _in_thread(lambda: launch.take(2))
    taker.join(10)
    assert not taker.is_alive() and len(launch.held) == 2
    assert launch.token_seconds == 0  # counted when given back
    launch.release()
    assert launch.token_seconds > 0  # what tests/suite_profile.py reports


def test_at_least_upgrades_for_a_launch_and_gives_back_after(tmp_path: Path) -> None:
    worker, other = Cores(tmp_path, 2), Cores(tmp_path, 2)
    worker.take(1)
    with worker.at_least(2):
        assert len(worker.held) == 2
        other_thread = _in_thread(lambda: other.take(1))
        time.sleep(0.3)
        assert not other.held
    other_thread.join(10)
    assert len(worker.held) == 1 and len(other.held) == 1


def test_built_once_builds_for_every_worker_once_and_redoes_a_broken_build(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    builds: list[Path] = []

    def build(path: Path) -> None:
        builds.append(path)
        time.sleep(0.2)  # the second asker arrives while this one builds
        path.mkdir()
        (path / "summary.json").write_text("{}")

    name = f"once-{time.monotonic_ns()}"
    results: list[Path] = []
    threads = [_in_thread(lambda: results.append(built_once(tmp_path_factory, name, build)))]
    threads.append(_in_thread(lambda: results.append(built_once(tmp_path_factory, name, build))))
    for thread in threads:
        thread.join(10)
    assert len(builds) == 1 and results == [builds[0], builds[0]]

    (builds[0] / "summary.json").unlink()  # a build that died half-way
    (builds[0] / "partial").write_text("")
    again = built_once(tmp_path_factory, name, build)
    assert len(builds) == 2 and not (again / "partial").exists()


def _under_xdist() -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def test_a_test_holds_one_token_under_xdist_and_none_without() -> None:
    found = cores()
    if not _under_xdist():
        assert found is None  # a plain `pytest` shares nothing
        return
    assert found is not None and len(found.held) == 1
    with at_least(2):  # what run_launch does around a dp=2 launch
        assert len(found.held) == 2
    assert len(found.held) == 1


@pytest.mark.multiproc
def test_a_multiproc_test_holds_one_token_per_core() -> None:
    found = cores()
    if not _under_xdist():
        assert found is None
        return
    assert found is not None and len(found.held) == found.count // TOKENS_PER_CORE
