"""A two-node job on the real cluster, two ranks per node, trains exactly what one process does.
(One rank per node: test_slurm_preempt.py and test_slurm_node_down.py, against the same
reference; a sweep submitting one job per point and returning at once: test_slurm_sweep.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import max_rel_diff, read_losses, read_summary, run_launch
from tests.slurm.conftest import JOB, job_log, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def test_a_two_node_job_matches_local(
    two_nodes: int, reference_losses: list[float], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "cluster=slurm", "parallel.nodes=2", "parallel.dp=4", *JOB]
    proc = run_launch(args, run_dir)
    out = proc.stdout + proc.stderr
    assert out.count("submitted SLURM job") == 1, out  # and `launch` returned without waiting
    wait_for(lambda: (run_dir / "summary.json").exists(), "the job")
    job = next(run_dir.glob("slurm-*.out")).stem.removeprefix("slurm-")
    assert "on n[1-2]" in job_log(run_dir, job)  # the job really spanned both nodes
    assert read_summary(run_dir)["world_size"] == 4
    assert max_rel_diff(read_losses(run_dir), reference_losses) < 1e-5
    script = (run_dir / "train.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in script and "RANKS_PER_NODE=2\n" in script
