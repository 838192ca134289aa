"""The real single-host SLURM cluster (../shared/slurm/start.sh); tests skip when it does not answer."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import FAST, read_losses, run_launch

# One small job shape for every SLURM test, so that one local run is the reference for all.
STEPS = 30
JOB = [
    *FAST,
    f"train.steps={STEPS}",
    "batch.global_size=8",
    "batch.micro_size=2",
    "cluster.time=00:10:00",
]


def cluster_nodes() -> int:
    """Nodes that `sinfo` reports up (0: no cluster answers)."""
    if shutil.which("sinfo") is None:
        return 0
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=15
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if proc.returncode != 0:
        return 0
    return sum(
        1
        for line in proc.stdout.splitlines()
        if line.split()[-1:] and "down" not in line and "drain" not in line
    )


@pytest.fixture(scope="session")
def slurm_nodes() -> int:
    nodes = cluster_nodes()
    if not nodes:
        pytest.skip(
            "no SLURM cluster answers `sinfo` (start one: SLURM_NODES=2 bash ../shared/slurm/start.sh)"
        )
    return nodes


@pytest.fixture(scope="session")
def two_nodes(slurm_nodes: int) -> int:
    if slurm_nodes < 2:
        pytest.skip(
            f"needs 2 SLURM nodes, the cluster has {slurm_nodes} (SLURM_NODES=2 bash ../shared/slurm/start.sh)"
        )
    return slurm_nodes


@pytest.fixture(scope="session")
def reference_losses(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The same job on this machine, one in-process rank: what every SLURM run must reproduce."""
    run_dir = tmp_path_factory.mktemp("local-reference")
    run_launch(["train", *JOB], run_dir)
    return read_losses(run_dir)


def job_id(output: str) -> str:
    match = re.search(r"submitted SLURM job (\d+)", output)
    assert match, f"no job id in:\n{output}"
    return match.group(1)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def job_finished(job: str) -> bool:
    """Gone from the queue, or in a final state (finished jobs stay listed for MinJobAge)."""
    proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
    state = proc.stdout.strip()
    return proc.returncode != 0 or state in ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def job_log(run_dir: Path, job: str) -> str:
    return "".join(
        p.read_text(errors="replace")
        for p in (run_dir / f"slurm-{job}.out", run_dir / f"slurm-{job}.err")
        if p.exists()
    )
