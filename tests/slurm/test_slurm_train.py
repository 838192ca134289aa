"""Two-node jobs on the real cluster train exactly what one process does; a sweep submits one job
per point and returns at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import max_rel_diff, read_losses, read_summary, run_launch
from tests.slurm.conftest import JOB, job_log, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def test_two_node_jobs_match_local(
    two_nodes: int, reference_losses: list[float], tmp_path: Path
) -> None:
    # Point 0: 1 rank per node; point 1: 2 ranks per node. Both jobs run at the same time.
    sweep = tmp_path / "sweep"
    args = ["train", "-m", "cluster=slurm", "parallel.nodes=2", "parallel.dp=2,4", *JOB]
    proc = run_launch([*args, f"hydra.sweep.dir={sweep}"])
    out = proc.stdout + proc.stderr
    assert out.count("submitted SLURM job") == 2, out  # and `launch` returned without waiting
    points = {2: sweep / "0", 4: sweep / "1"}
    wait_for(lambda: all((p / "summary.json").exists() for p in points.values()), "both jobs")
    for dp, point in points.items():
        job = next(point.glob("slurm-*.out")).stem.removeprefix("slurm-")
        assert "on n[1-2]" in job_log(point, job)  # the job really spanned both nodes
        assert read_summary(point)["world_size"] == dp
        assert max_rel_diff(read_losses(point), reference_losses) < 1e-5
        script = (point / "train.sbatch").read_text()
        assert "#SBATCH --nodes=2\n" in script and f"RANKS_PER_NODE={dp // 2}\n" in script
