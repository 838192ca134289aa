"""The real single-host SLURM cluster (../shared/slurm/start.sh). Without one, the tests skip
with the reason; in CI (CI=true, as .ci/run sets it) they fail instead, so a CI run without SLURM
coverage is never green."""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest

from tests.helpers import FAST, read_losses, run_launch
from tests.once import built_once

# One small job shape for every SLURM test, so that one local run is the reference for all.
STEPS = 30
JOB = [
    *FAST,
    f"train.steps={STEPS}",
    "batch.global_size=8",
    "batch.micro_size=2",
    "cluster.time=00:10:00",
]


# `launch` submits the job and waits for it (sbatch --wait) while a test plays the scheduler.
TRAIN_AND_WAIT = ["train", "cluster=slurm", "cluster.wait=true"]

NODES_LOCK = Path("/tmp/launcher-test-slurm-nodes.lock")
"""Every SLURM test holds it shared (the pytest workers' jobs share the nodes); a test that takes
a node out of service (marker `takes_node_down`) holds it alone, so that no other test's job is on
that node and no probe sees it drained."""


@contextmanager
def nodes_lock(exclusive: bool = False) -> Iterator[None]:
    with NODES_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _share_the_nodes(request: pytest.FixtureRequest) -> Iterator[None]:
    with nodes_lock(exclusive=request.node.get_closest_marker("takes_node_down") is not None):
        yield


PROBE_TIMEOUT_S = 3.0
"""A controller that answers at all answers `sinfo` within a second; without one, sinfo retries for
its MessageTimeout (about 9 s here) before it fails. Wait this long, once per test session."""


@functools.cache
def cluster_probe() -> tuple[int, str]:
    """(nodes up, why none) from one `sinfo` per test session; 0 nodes: skip, with the reason.

    sinfo reads SLURM_CONF when it is set (the environment is passed through), else
    /etc/slurm/slurm.conf; with neither file there is no cluster to ask.
    """
    if shutil.which("sinfo") is None:
        return 0, "sinfo is not on PATH"
    conf = os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if not Path(conf).is_file():
        return 0, f"no SLURM config at {conf} (SLURM_CONF)"
    try:
        with nodes_lock():  # not while a test has a node out of service
            proc = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %T"],
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
            )
    except subprocess.TimeoutExpired:
        return 0, f"`sinfo` did not answer within {PROBE_TIMEOUT_S:g} s (no controller running?)"
    except OSError as exc:
        return 0, f"`sinfo` could not run ({exc})"
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return 0, f"`sinfo` failed: {detail}"
    nodes = sum(
        1
        for line in proc.stdout.splitlines()
        if line.split()[-1:] and "down" not in line and "drain" not in line
    )
    return nodes, "" if nodes else "`sinfo` reports no node up"


def cluster_nodes() -> int:
    """Nodes that `sinfo` reports up (0: no cluster answers); probed once per test session."""
    return cluster_probe()[0]


START = "SLURM_NODES=2 bash ../shared/slurm/start.sh"


def in_ci() -> bool:
    """CI=true (GitHub, GitLab and .ci/run set it); "", "0" and "false" mean a local run."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def missing_cluster(reason: str) -> NoReturn:
    """No usable cluster: a skip on a workstation, a failure in CI."""
    if in_ci():
        pytest.fail(f"CI=true but {reason}: the SLURM tests must run in CI (start: {START})")
    pytest.skip(f"{reason} (start one: {START})")


def require_nodes(wanted: int) -> int:
    """The nodes up, at least `wanted` of them; else a skip (a failure in CI) with the reason."""
    nodes, why = cluster_probe()
    if not nodes:
        missing_cluster(f"no SLURM cluster: {why}")
    if nodes < wanted:
        missing_cluster(f"needs {wanted} SLURM nodes, the cluster has {nodes}")
    return nodes


@pytest.fixture(scope="session")
def slurm_nodes() -> int:
    return require_nodes(1)


@pytest.fixture(scope="session")
def two_nodes() -> int:
    return require_nodes(2)


@pytest.fixture(scope="session")
def reference_losses(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The same job on this machine, one in-process rank: what every SLURM run must reproduce."""
    run_dir = built_once(
        tmp_path_factory, "local-reference", lambda path: run_launch(["train", *JOB], path)
    )
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
