"""batch.micro_size=auto under pipeline parallelism: the candidates are the micro sizes whose
accumulation the schedule runs, the step-time model counts the pipeline's bubble, the default
split is balanced at the chosen micro size and written into the config the ranks run, and a
global batch no candidate serves is one ConfigError whose Fix runs as printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hydra import compose

from launcher.config import to_root_config
from launcher.config.root import RootConfig
from launcher.errors import ConfigError
from launcher.memory.auto import candidate_micro_sizes
from tests.helpers import run_launch

TINY = ["model.n_head=4", "model.d_model=32", "model.seq_len=24", "model.n_layer=3"]
AUTO_PP2 = [*TINY, "parallel.pp=2", "batch.micro_size=auto"]


def config(overrides: list[str]) -> RootConfig:
    return to_root_config(compose(config_name="config", overrides=overrides))


def test_candidates_are_the_accumulations_the_schedule_runs(hydra_conf: None) -> None:
    # 6 sequences per rank: 1F1B at pp=2 needs grad_accum >= 2, interleaved a multiple of 2
    six = [*AUTO_PP2, "batch.global_size=6"]
    assert candidate_micro_sizes(config(six)) == [3, 2, 1]
    interleaved = [*six, "parallel.pp_schedule=interleaved_1f1b", "model.n_layer=4"]
    assert candidate_micro_sizes(config(interleaved)) == [3, 1]
    assert candidate_micro_sizes(config([*six, "parallel.pp_schedule=gpipe"])) == [6, 3, 2, 1]


def test_no_candidate_is_one_error_whose_fix_runs(hydra_conf: None) -> None:
    with pytest.raises(ConfigError) as info:
        config([*AUTO_PP2, "batch.global_size=1"])
    error = info.value
    assert error.keys[0] == "batch.grad_accum"
    assert "batch.micro_size=auto finds none" in error.problem
    fix = "set batch.global_size=2 batch.grad_accum=2 batch.micro_size=null"
    assert error.fix.startswith(fix), error.fix
    config([*AUTO_PP2, *fix.removeprefix("set ").split()])  # the fix as printed


# last: an in-process `launch` leaves Hydra's global state cleared for this module
def test_auto_under_pp_weighs_the_bubble_and_the_ranks_run_its_split(tmp_path: Path) -> None:
    """16 sequences at pp=2 1F1B: by the step-time model (1 + 0.25 / micro) / (1 - bubble),
    micro 2 (8 micro-batches, bubble 1/9) beats micro 8 (2, bubble 1/3) and micro 1; micro 16
    (one micro-batch) is no candidate. The balanced split reaches config.yaml."""
    args = ["plan", *AUTO_PP2, "batch.global_size=16", "wandb.mode=disabled"]
    proc = run_launch(args, tmp_path / "run")
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert (plan["micro_size"], plan["grad_accum"]) == (2, 8)
    assert "batch.micro_size=4 fits but its steps are slower" in proc.stdout
    ran = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert ran["parallel"]["pp_split"] == plan["pipeline"]["split"]
    assert (ran["batch"]["micro_size"], ran["batch"]["grad_accum"]) == (2, None)
