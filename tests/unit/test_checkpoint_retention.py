"""checkpoint.keep and the evaluations' .pending markers (launcher/checkpoint/retention.py): a
checkpoint an evaluation has not read yet is kept past checkpoint.keep with a word, at most keep
of them; an older one is pruned with a warning naming its evaluation, its marker removed."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.checkpoint.retention import past_keep
from launcher.logs import LOGGER_NAME
from launcher.rundir import PENDING_SUFFIX, harness_file

KEEP = 2


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logger = logging.getLogger(LOGGER_NAME)
    old, logger.propagate = logger.propagate, True
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        yield caplog
    logger.propagate = old


def pending(run_dir: Path, *steps: int) -> None:
    for step in steps:
        marker = harness_file(run_dir, step, PENDING_SUFFIX)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


def stale(run_dir: Path, *steps: int) -> list[tuple[int, Path]]:
    """Checkpoints past checkpoint.keep, newest first."""
    return [(s, run_dir / "checkpoints" / f"step_{s}") for s in steps]


def test_a_pending_checkpoint_is_kept_past_keep_and_said_once(
    tmp_path: Path, warnings: pytest.LogCaptureFixture
) -> None:
    pending(tmp_path, 6)
    assert past_keep(tmp_path, stale(tmp_path, 6, 4), KEEP) == [tmp_path / "checkpoints/step_4"]
    (said,) = [r.getMessage() for r in warnings.records]
    assert "keeping checkpoint" in said and "step_6.pending" in said and "keep=2" in said
    warnings.clear()
    past_keep(tmp_path, stale(tmp_path, 8, 6), KEEP)  # the next save: not said again
    assert not warnings.records


def test_pending_checkpoints_past_the_bound_are_pruned_with_a_warning(
    tmp_path: Path, warnings: pytest.LogCaptureFixture
) -> None:
    pending(tmp_path, 10, 8, 6, 4)  # e.g. queued SLURM jobs that never ran
    removed = past_keep(tmp_path, stale(tmp_path, 10, 8, 6, 4), KEEP)
    assert removed == [tmp_path / "checkpoints/step_6", tmp_path / "checkpoints/step_4"]
    pruned = [r.getMessage() for r in warnings.records if "pruned checkpoint" in r.getMessage()]
    assert len(pruned) == 2 and "step_6.pending" in pruned[0] and "step_4.pending" in pruned[1]
    assert all("Fix: raise checkpoint.keep" in m for m in pruned)
    left = sorted(p.name for p in (tmp_path / "eval").iterdir())
    assert left == ["step_10.pending", "step_8.pending"]  # the released ones' markers are gone
