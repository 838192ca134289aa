"""An elastic job gets its restarts by default (train.max_restarts=null): `launch plan` accepts
`parallel.min_nodes=1` alone, says how many restarts the job got, and writes that number into
config.yaml and train.sbatch; an explicit train.max_restarts wins."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers import run_launch

pytestmark = pytest.mark.e2e

ELASTIC = ["parallel.dp=2", "parallel.nodes=2", "parallel.min_nodes=1", "cluster=slurm"]


@pytest.mark.parametrize(("extra", "restarts"), [([], 3), (["train.max_restarts=1"], 1)])
def test_an_elastic_plan_says_its_restarts(extra: list[str], restarts: int, tmp_path: Path) -> None:
    proc = run_launch(["plan", *ELASTIC, *extra], tmp_path)
    said = [line for line in proc.stdout.splitlines() if "restart(s)" in line]
    assert said == [
        f"elastic     {restarts} restart(s) (train.max_restarts): each lost node or failed rank "
        "uses one"
    ], proc.stdout
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["train"]["max_restarts"] == restarts
    assert f"TORCHRUN_RESTARTS={restarts}\n" in (tmp_path / "train.sbatch").read_text()


def test_a_job_that_is_not_elastic_gets_no_restarts(tmp_path: Path) -> None:
    proc = run_launch(["plan", "parallel.dp=2", "parallel.nodes=2", "cluster=slurm"], tmp_path)
    assert "restart(s)" not in proc.stdout
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["max_restarts"] == 0
    assert "TORCHRUN_RESTARTS=0\n" in (tmp_path / "train.sbatch").read_text()
