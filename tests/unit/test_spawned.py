"""tests/spawned.py: a rank group forked from the forkserver runs every rank, counts the ranks'
CPU for the suite profile, and raises a rank's error as mp.spawn does."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from torch.multiprocessing import ProcessRaisedException

from tests.served import CPU_SECONDS
from tests.spawned import run_ranks

pytestmark = pytest.mark.multiproc


def _busy(rank: int, out: str) -> None:
    end = time.process_time() + 0.2  # CPU the group must count
    while time.process_time() < end:
        pass
    Path(out, f"rank{rank}").write_text("ran")


def _raises(rank: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 failed")


def test_every_rank_runs_and_its_cpu_is_counted(tmp_path: Path) -> None:
    before = CPU_SECONDS[0]
    run_ranks(_busy, (str(tmp_path),), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    assert CPU_SECONDS[0] - before >= 0.4


def test_a_rank_that_raises_raises_here() -> None:
    with pytest.raises(ProcessRaisedException, match="rank 1 failed"):
        run_ranks(_raises, (), 2)
