"""parallel.pp_stages_per_rank and parallel.pp_split: the stage layout that the split, the
schedule, the memory plan and `launch plan` share. Bad values are one ConfigError naming the key
before launch, and the printed Fix is run as printed; the default split is balanced by the memory
plan's costs (embedding on the first stage, final norm and head on the last) and may be unequal;
the plan's per-rank memory follows the actual split and reports the busiest rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hydra import compose

from launcher.config import to_root_config
from launcher.config.pipeline import bubble
from launcher.config.root import RootConfig
from launcher.config.stages import balanced_starts, even_starts, stage_layout
from launcher.errors import ConfigError
from tests.helpers import run_launch

TINY = ["model.n_head=4", "model.d_model=32", "model.seq_len=24", "batch.global_size=8"]
PP2 = ["parallel.pp=2", "batch.grad_accum=4"]


@pytest.fixture(autouse=True)
def _hydra(hydra_conf: None) -> None:
    """Every config here is composed from conf/ with command-line overrides."""


def config(overrides: list[str]) -> RootConfig:
    return to_root_config(compose(config_name="config", overrides=[*TINY, *overrides]))


def refused(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config(overrides)
    return info.value


def printed_fix(error: ConfigError) -> str:
    """The override the Fix names first ("set KEY=VALUE, or ...")."""
    assert error.fix.startswith("set "), error.fix
    return error.fix.removeprefix("set ").split(" ")[0].rstrip(",.")


def replaced(overrides: list[str], fix: str) -> list[str]:
    key = fix.split("=")[0]
    return [*(o for o in overrides if o.split("=")[0] != key), fix]


@pytest.mark.parametrize(
    ("schedule", "asked", "fix"),
    [
        ("gpipe", 2, "parallel.pp_stages_per_rank=1"),
        ("1f1b", 3, "parallel.pp_stages_per_rank=1"),
        ("interleaved_1f1b", 1, "parallel.pp_stages_per_rank=2"),
    ],
)
def test_stages_per_rank_outside_its_schedule_is_refused_and_the_fix_works(
    schedule: str, asked: int, fix: str
) -> None:
    overrides = [*PP2, "model.n_layer=4", f"parallel.pp_schedule={schedule}"]
    overrides.append(f"parallel.pp_stages_per_rank={asked}")
    error = refused(overrides)
    assert error.keys[0] == "parallel.pp_stages_per_rank"
    assert printed_fix(error) == fix
    config(replaced(overrides, fix))  # the fix as printed


def test_three_virtual_stages_per_rank_reach_the_layout_and_the_bubble() -> None:
    cfg = config(
        [
            *PP2,
            "model.n_layer=6",
            "parallel.pp_schedule=interleaved_1f1b",
            "parallel.pp_stages_per_rank=3",
        ]
    )
    layout = stage_layout(cfg)
    assert (layout.n_stages, layout.per_rank) == (6, 3)
    assert [layout.rank_of(s) for s in range(6)] == [0, 1, 0, 1, 0, 1]
    assert layout.stages_of(1) == [1, 3, 5]
    assert [list(r) for r in layout.ranges()] == [[0], [1], [2], [3], [4], [5]]
    assert bubble(2, 4, 3) == pytest.approx(1 / 13)
    # the default for interleaved is 2; fewer blocks than stages is refused naming parallel.pp
    three = ["parallel.pp_schedule=interleaved_1f1b", "parallel.pp_stages_per_rank=3"]
    error = refused([*PP2, "model.n_layer=5", *three])
    assert error.keys[0] == "parallel.pp"


@pytest.mark.parametrize(
    ("split", "problem"),
    [
        ("[2,1]", "not strictly increasing"),
        ("[2,2]", "not strictly increasing"),
        ("[4]", "outside 1..3"),
        ("[0]", "outside 1..3"),
        ("[1,2]", "2 start(s); 2 stages need 1"),
        ("[]", "0 start(s); 2 stages need 1"),
    ],
    ids=["decreasing", "empty_stage", "past_the_end", "empty_first", "too_many", "too_few"],
)
def test_a_bad_split_is_refused_naming_pp_split_and_the_printed_fix_works(
    split: str, problem: str
) -> None:
    overrides = [*PP2, "model.n_layer=4", f"parallel.pp_split={split}"]
    if split in ("[2,1]", "[2,2]"):  # three starts' worth of stages: 4 stages over 2 ranks
        overrides = [*PP2, "model.n_layer=4", "parallel.pp_schedule=interleaved_1f1b"]
        overrides += [f"parallel.pp_split={split[:-1]},3]"]
    error = refused(overrides)
    assert error.keys[0] == "parallel.pp_split"
    assert problem in error.problem
    fixed = config(replaced(overrides, printed_fix(error)))  # the fix as printed
    assert all(len(r) >= 1 for r in stage_layout(fixed).ranges())
    config(replaced(overrides, "parallel.pp_split=null"))  # the other fix it names


def test_a_split_without_a_pipeline_is_refused() -> None:
    error = refused(["parallel.pp_split=[1]", "model.n_layer=2"])
    assert error.keys == ["parallel.pp_split", "parallel.pp"]
    config(["model.n_layer=2", printed_fix(error)])


def test_an_explicit_split_sets_the_stages() -> None:
    cfg = config([*PP2, "model.n_layer=4", "parallel.pp_split=[3]"])
    assert [list(r) for r in stage_layout(cfg).ranges()] == [[0, 1, 2], [3]]


def test_balanced_starts_weigh_the_embedding_and_the_head() -> None:
    assert even_starts(4, 2) == [2]
    assert even_starts(5, 2) == [2]  # the later stage one block longer
    assert balanced_starts([10] * 4, 0, 0, 2) == [2]
    assert balanced_starts([10] * 6, 0, 0, 3) == [2, 4]
    assert balanced_starts([10] * 4, 0, 25, 2) == [3]  # a heavy head: fewer blocks last
    assert balanced_starts([10] * 4, 25, 0, 2) == [1]
    # a head heavier than every block still leaves the last stage one block
    assert balanced_starts([10] * 4, 0, 1000, 2) == [3]
    assert balanced_starts([10] * 12, 55, 55, 4) == [1, 6, 11]


def test_the_plan_balances_an_uneven_model_and_follows_an_explicit_split(tmp_path: Path) -> None:
    """n_layer=3 over 2 stages is not refused: the plan resolves the balanced split into the
    config the ranks run (config.yaml) and plans every pipeline rank from its actual stages; an
    explicit split moves the parameters and the peak with it."""
    args = ["plan", *TINY, *PP2, "wandb.mode=disabled"]
    proc = run_launch([*args, "model.n_layer=3"], tmp_path / "balanced")
    plan = json.loads((tmp_path / "balanced" / "plan.json").read_text())
    pipeline = plan["pipeline"]
    assert len(pipeline["split"]) == 1 and pipeline["stages_per_rank"] == 1
    ran = yaml.safe_load((tmp_path / "balanced" / "config.yaml").read_text())
    assert ran["parallel"]["pp_split"] == pipeline["split"]  # what the ranks run
    assert sorted(len(s["blocks"]) for s in pipeline["stages"]) == [1, 2]
    ranks = pipeline["ranks"]
    assert plan["planned_peak_bytes"] == max(r["planned_peak_bytes"] for r in ranks)
    assert sum(r.get("peak", False) for r in ranks) == 1
    assert "pp rank 1:" in proc.stdout and "(the plan's peak)" in proc.stdout
    # 1F1B: the first stage holds pp=2 micro-batches at its peak, the last one
    assert [r["held_micro_batches"] for r in ranks] == [2, 1]

    first, last = [], []
    for start in (1, 2):
        run_dir = tmp_path / f"split{start}"
        run_launch([*args, "model.n_layer=3", f"parallel.pp_split=[{start}]"], run_dir)
        chosen = json.loads((run_dir / "plan.json").read_text())["pipeline"]
        assert [len(s["blocks"]) for s in chosen["stages"]] == [start, 3 - start]
        first.append(chosen["ranks"][0])
        last.append(chosen["ranks"][1])
    assert first[1]["parameters"] > first[0]["parameters"]
    assert last[1]["parameters"] < last[0]["parameters"]
    assert first[1]["activation_bytes"] > first[0]["activation_bytes"]
