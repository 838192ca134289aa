"""Hybrid sharding through `launch`: FSDP2 on a 2 x 2 mesh (parallel.replicate=2 over 4 gloo
ranks) trains the curve of one process, and its checkpoint resumes on plain FSDP at dp=2.

fp32, dropout 0, 4 steps of 16 sequences: dp 4 x grad_accum 2 x micro 2 against one process
running the whole global batch; checkpoints at steps 2 and 4.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import FAST, max_rel_diff, read_losses, read_metrics, run_launch

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

COMMON = [
    "train",
    *FAST,
    "model.dropout=0",
    "train.precision=fp32",
    "train.steps=4",
    "batch.global_size=16",
    "data.eval_problems=1",
    "engine=fsdp",
]
ENV = {"OMP_NUM_THREADS": "1"}


def test_hsdp_2x2_matches_one_process_and_resumes_on_plain_fsdp(tmp_path: Path) -> None:
    reference, hsdp, resumed = tmp_path / "one", tmp_path / "hsdp", tmp_path / "fsdp_dp2"
    run_launch([*COMMON, "parallel.dp=1", "checkpoint.enabled=false"], reference, env=ENV)
    hsdp_args = ["parallel.dp=4", "parallel.replicate=2", "batch.micro_size=2"]
    run_launch([*COMMON, *hsdp_args, "checkpoint.every=2"], hsdp, env=ENV)
    plan = json.loads((hsdp / "plan.json").read_text())
    assert plan["engine_options"][0].startswith("hybrid sharding (HSDP): state sharded over 2")
    one = read_losses(reference)
    assert len(one) == 4 and max_rel_diff(read_losses(hsdp), one) < 1e-5
    # The step-2 checkpoint of the 2 x 2 mesh, loaded by two ranks of plain FSDP.
    shutil.copytree(hsdp / "checkpoints" / "step_2", tmp_path / "from_hsdp")
    proc = run_launch(
        [*COMMON, "parallel.dp=2", "batch.micro_size=4", f"train.resume={tmp_path / 'from_hsdp'}"],
        resumed,
        env=ENV,
    )
    assert "resharded" in proc.stdout
    steps = {m["step"]: m["loss"] for m in read_metrics(resumed)}
    assert sorted(steps) == [3, 4]
    assert max_rel_diff([steps[3], steps[4]], one[2:]) < 1e-5
