"""Issue 17's bad day through `launch`, with real processes and real files: every checkpoint
damaged, a loss that becomes NaN, a plan larger than the machine, and a full disk (a real tmpfs of
a few MiB as the run directory). The console noise of a plain run: tests/e2e/test_secrets.py."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.checkpoint.files import find_checkpoints, inspect
from launcher.exit_codes import DIVERGED
from tests.helpers import FAST, read_metrics, read_summary, run_launch

pytestmark = pytest.mark.e2e

ENV = {"OMP_NUM_THREADS": "1"}
SMALL = ["train", *FAST, "batch.global_size=8", "batch.micro_size=4"]
HUGE = "batch.global_size=1000000000000"


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if "error:" in line]


# --- item 10: damaged checkpoints are never silently restarted over -----------------------------


CHECKPOINTED = [*SMALL, "train.steps=4", "checkpoint.every=2"]


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run with checkpoints at steps 2 and 4, trained once; each test damages a copy."""
    run_dir = tmp_path_factory.mktemp("checkpointed") / "run"
    run_launch(CHECKPOINTED, run_dir, env=ENV)
    return run_dir


@pytest.mark.parametrize("damage", ["truncated", "unloadable"])
def test_when_no_checkpoint_can_be_resumed_launch_refuses_and_keeps_them(
    damage: str, checkpointed: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(checkpointed, run_dir)
    root = run_dir / "checkpoints"
    for ckpt in sorted(root.glob("step_*")):
        if damage == "truncated":  # `launch` sees it against complete.json, before any rank
            shard = max((ckpt / "engine").glob("*.distcp"), key=os.path.getsize)
            os.truncate(shard, shard.stat().st_size - 100)
        else:  # same size: only the rank that loads it can tell
            metadata = ckpt / "engine" / ".metadata"
            metadata.write_bytes(b"\0" * metadata.stat().st_size)
    before, metrics = snapshot(root), (run_dir / "metrics.jsonl").read_text()

    proc = run_launch(CHECKPOINTED, run_dir, env=ENV, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = [e for e in errors(proc) if "train.resume" in e]
    assert "step_2 (" in line and "step_4 (" in line and "none can be resumed" in line
    assert "train.resume=never checkpoint.overwrite=true" in line
    assert "Traceback" not in proc.stderr
    assert snapshot(root) == before  # not one byte overwritten
    assert (run_dir / "metrics.jsonl").read_text() == metrics  # no second history appended

    # The explicit way to start over.
    start_over = ["train.resume=never", "checkpoint.overwrite=true"]
    run_launch([*CHECKPOINTED, *start_over], run_dir, env=ENV)
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3, 4]


# --- item 12: a loss that becomes NaN; a plan larger than the machine ---------------------------


@pytest.mark.parametrize("dp", [1, 2])
def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(
    dp: int, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = [*SMALL, f"parallel.dp={dp}", "train.steps=6", "checkpoint.every=1"]
    proc = run_launch(
        [*args, "optim.lr=1e30", "optim.warmup_steps=0"], run_dir, env=ENV, check=False
    )
    # Through torchrun too: `launch` returns the status of the rank that failed first.
    assert proc.returncode == DIVERGED, proc.stdout + proc.stderr
    found = [e for e in errors(proc) if "the loss is nan" in e or "the loss is inf" in e]
    assert found, proc.stdout + proc.stderr
    match = re.search(r"error: step (\d+): the loss is (nan|inf)", found[0])
    assert match is not None, found[0]
    bad = int(match.group(1))
    assert "the last good checkpoint is step" in found[0] and "Fix: lower optim.lr" in found[0]
    saved = [c.step for c in find_checkpoints(run_dir)]
    assert saved and max(saved) == bad - 1  # nothing of the NaN state was saved
    assert (
        f"checkpoint is step {bad - 1} ({run_dir / 'checkpoints' / f'step_{bad - 1}'})" in found[0]
    )
    logged = read_metrics(run_dir)
    assert [m["step"] for m in logged] == list(range(1, bad))
    assert all(math.isfinite(m["loss"]) for m in logged)
    assert not (run_dir / "summary.json").exists()  # the run did not say "done"
    assert "done:" not in proc.stdout


def test_a_plan_larger_than_the_machine_is_refused_before_anything_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_launch([*SMALL[:-1], HUGE], run_dir, check=False)
    assert proc.returncode == 2
    [line] = errors(proc)
    assert line.startswith("error: batch.micro_size, ac, engine.zero_stage, parallel.dp:")
    assert "GiB per rank" in line and "this machine's RAM" in line
    assert "batch.micro_size=" in line and "smallest achievable" in line
    assert not (run_dir / "config.yaml").exists()  # nothing written, nothing started
    # A SLURM plan is checked against cluster.mem alone: tests/unit/test_plan_memory.py.


# --- item 13: a full disk while writing a checkpoint --------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 3 MiB tmpfs: room for one checkpoint of the FAST model (about 1.7 MiB), not two."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except OSError as exc:
        pytest.skip(f"cannot mount a small tmpfs to fill ({exc})")
    if done.returncode != 0:
        pytest.skip(f"mounting a small tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def test_a_full_disk_ends_in_one_line_and_the_run_resumes(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    args = [*SMALL, "train.steps=6", "checkpoint.every=1"]
    proc = run_launch(args, run_dir, env=ENV, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    [line] = errors(proc)
    root = run_dir / "checkpoints"
    assert line.startswith(f"error: no space left on device writing {root}"), line
    assert f"the last complete checkpoint is step 1 ({root / 'step_1'})" in line
    assert sorted(p.name for p in root.iterdir()) == ["step_1"]  # the partial save is gone
    assert not isinstance(inspect(root / "step_1"), str)  # intact

    # With room again, the same command resumes from it.
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    proc = run_launch(args, run_dir, env=ENV)
    assert f"resuming from {root / 'step_1'} after step 1" in proc.stdout
    assert read_summary(run_dir)["steps"] == 6
