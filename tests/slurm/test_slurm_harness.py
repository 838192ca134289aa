"""Evaluation during training on the local SLURM cluster (issue 36): with eval.harness.every, the
training job's rank 0 submits each chosen checkpoint's evaluation as a job of its own once the
checkpoint is complete; that job writes eval/step_N.json and the metrics.jsonl line at step N."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.test_lm_eval import MC, _write_tasks
from tests.helpers import FAST, read_metrics, run_launch
from tests.installed import require
from tests.slurm.conftest import job_id, wait_for

require("lm_eval")

pytestmark = pytest.mark.slurm

STEPS = 4


def test_the_evaluation_runs_as_its_own_job(slurm_nodes: int, tmp_path: Path) -> None:
    tasks = _write_tasks(tmp_path)
    run = tmp_path / "run"
    proc = run_launch(
        [
            "train",
            "cluster=slurm",
            "cluster.wait=true",
            "cluster.time=00:10:00",
            *FAST,
            f"train.steps={STEPS}",
            "batch.global_size=8",
            f"eval.harness.every={STEPS}",
            f"eval.harness.tasks=[{MC}]",
            f"eval.harness.include_path={tasks}",
            "eval.harness.limit=4",
            "eval.harness.time=00:10:00",
        ],
        run,
    )
    training = job_id(proc.stdout + proc.stderr)
    log = (run / f"slurm-{training}.out").read_text() + (run / f"slurm-{training}.err").read_text()
    found = re.search(r"submitted SLURM job (\d+): the evaluation of step (\d+)", log)
    assert found, log
    evaluation, step = found.group(1), int(found.group(2))
    assert step == STEPS and evaluation != training
    assert (run / "eval" / f"step_{STEPS}.sbatch").is_file()
    record_file = run / "eval" / f"step_{STEPS}.json"
    wait_for(record_file.is_file, "the evaluation job's eval/step_4.json", timeout=300)
    record = json.loads(record_file.read_text())
    job_out = run / "eval" / f"slurm-{evaluation}.out"
    assert "error" not in record, job_out.read_text() if job_out.exists() else record
    assert job_out.is_file()  # it ran as its own job, with its own log
    lines = [m for m in read_metrics(run) if f"harness/{MC}/acc" in m]
    assert [m["step"] for m in lines] == [STEPS]
    assert lines[0][f"harness/{MC}/acc"] == record["results"][MC]["acc,none"]
