"""The memory plan (issue 14): sizes, the micro_size/ac representations, the fake-tensor probe
against a real measurement, the parts by engine, the budget's errors and the automatic choice."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from launcher.config.ac import AcConfig, AcPolicy
from launcher.config.load import to_root_config
from launcher.config.model import ModelConfig, UserModelConfig
from launcher.config.parallel import BatchConfig
from launcher.config.root import RootConfig
from launcher.config.train import parse_size
from launcher.errors import ConfigError
from launcher.memory.auto import choose, resolved
from launcher.memory.budget import Budget
from launcher.memory.parts import state_parts
from launcher.memory.peak import PeakMeter
from launcher.memory.planner import Planner
from launcher.memory.probe import probe_activations
from launcher.models import build_model
from launcher.models.shape import ModelShape
from launcher.plan import model_info, plan_split
from launcher.recompute.measure import measure_activations
from launcher.recompute.policies import apply_recompute
from launcher.runners.inprocess import InProcessRunner

MIB = 2**20
FIX = "tests.fixtures.models"


def config(**sections: dict[str, Any]) -> RootConfig:
    base: dict[str, Any] = {
        "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 32},
        "batch": {"global_size": 16},
        "wandb": {"mode": "disabled"},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return to_root_config(base)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123", 123),
        (4096, 4096),
        ("512MiB", 512 * MIB),
        ("40GiB", 40 * 2**30),
        ("1.5GB", 15 * 10**8),
        ("2G", 2 * 2**30),
        ("10 kb", 10_000),
    ],
)
def test_budget_sizes(text: str | int, expected: int) -> None:
    assert parse_size("train.memory_budget", text) == expected


@pytest.mark.parametrize("bad", ["abc", "12iB", "-5MiB", "0", "5 parsecs"])
def test_a_bad_budget_is_one_error_naming_the_key(bad: str) -> None:
    with pytest.raises(
        ConfigError, match=r"train\.memory_budget.*e\.g\. train\.memory_budget=40GiB"
    ):
        config(train={"memory_budget": bad})


def test_micro_size_takes_numbers_and_auto() -> None:
    assert BatchConfig(global_size=16, micro_size="4").micro_size == 4
    assert BatchConfig(global_size=16, micro_size=4).micro == 4
    auto = BatchConfig(global_size=16, micro_size="auto")
    assert auto.auto and auto.micro is None
    with pytest.raises(ConfigError, match=r"batch\.micro_size.*not a whole number or auto"):
        BatchConfig(global_size=16, micro_size="some")
    with pytest.raises(ConfigError, match=r"leave batch\.grad_accum=null"):
        BatchConfig(global_size=16, micro_size="auto", grad_accum=2)
    assert config(batch={"micro_size": "auto"}).split().micro_size == 16  # before the plan


@pytest.mark.parametrize("policy", AcPolicy.granularities())
def test_the_fake_probe_measures_what_a_real_pass_does(policy: AcPolicy) -> None:
    cfg = config(ac={"policy": policy.value})
    line = probe_activations(cfg, [policy])[policy]
    assert line.method == "fake tensors"
    torch.manual_seed(0)
    model = build_model(cfg.model)
    apply_recompute(model, AcConfig(policy=policy), None)
    inputs = torch.randint(0, cfg.model.vocab_size, (3, cfg.model.seq_len))
    real = measure_activations(model, inputs, inputs)
    # Probed at one and two sequences, extrapolated to three: a few bytes of rounding apart.
    assert line.saved(3) == pytest.approx(real.saved, rel=0.005)
    assert line.peak(3) == pytest.approx(real.peak, rel=0.005)


def test_the_probe_runs_a_users_own_model() -> None:
    cfg = RootConfig(
        model=UserModelConfig(_target_=f"{FIX}.TinyLM", seq_len=24, kwargs={"d_model": 16}),
        ac=AcConfig(policy=AcPolicy.full),
    )
    lines = probe_activations(cfg, [AcPolicy.none, AcPolicy.full])
    assert lines[AcPolicy.none].peak(4) > lines[AcPolicy.full].peak(4) > 0


def peak_rss() -> int:
    """This process's resident high-water mark (VmHWM), in bytes."""
    found = re.search(r"^VmHWM:\s+(\d+) kB$", Path("/proc/self/status").read_text(), re.M)
    assert found, "no VmHWM in /proc/self/status"
    return int(found.group(1)) * 1024


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM to the current resident size."""
    Path("/proc/self/clear_refs").write_text("5")


def test_a_1b_config_plans_on_fake_tensors_without_real_memory() -> None:
    cfg = config(
        model={"n_layer": 24, "n_head": 16, "d_model": 2048, "seq_len": 2048, "vocab_size": 50304},
        batch={"global_size": 8, "micro_size": 2},
        train={"memory_budget": "1TiB"},  # planned for a big machine, not this one
    )
    reset_peak_rss()  # an earlier, higher peak of this process would hide the one looked for
    rss_before = peak_rss()
    info = model_info(cfg)
    _, choice = plan_split(cfg, info, InProcessRunner())
    grown = peak_rss() - rss_before
    assert info.parameters > 1_000_000_000
    assert choice.plan.parts["parameters"] == info.parameters * 4
    assert choice.plan.parts["activations"] > 10 * 2**30  # two sequences of 2048 tokens
    assert grown < 512 * MIB  # the weights alone would be 5 GiB


SMALL = {"zero_optimization": {"reduce_bucket_size": 10}}


def shape(params: int = 1000, block: int = 100, blocks: int = 8) -> ModelShape:
    return ModelShape(params, block, blocks, 400)


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ({"name": "ddp"}, (4000, 4000, 8000, 0)),
        ({"name": "deepspeed", "zero_stage": 1, "extra": SMALL}, (4000, 1000, 2000, 1000)),
        ({"name": "deepspeed", "zero_stage": 2, "extra": SMALL}, (4000, 1000, 2000, 1000)),
        ({"name": "deepspeed", "zero_stage": 3, "extra": SMALL}, (1000, 1000, 2000, 1000)),
        ({"name": "fsdp"}, (1000, 1000, 2000, 0)),
    ],
)
def test_model_state_is_sharded_by_engine_and_stage(
    engine: dict[str, Any], expected: tuple[int, ...]
) -> None:
    cfg = config(engine=engine, parallel={"dp": 4})
    parts = state_parts(cfg, shape())
    got = tuple(
        parts[k] for k in ("parameters", "gradients", "optimizer_state", "precision_copies")
    )
    assert got == expected


def test_deepspeed_buckets_come_from_its_config() -> None:
    cfg = config(engine={"name": "deepspeed", "zero_stage": 2}, parallel={"dp": 2})
    default = state_parts(cfg, shape())["comm_buffers"]
    extra = {"zero_optimization": {"reduce_bucket_size": 1000}}
    small = config(
        engine={"name": "deepspeed", "zero_stage": 2, "extra": extra}, parallel={"dp": 2}
    )
    assert default == 5 * 10**8 * 4 and state_parts(small, shape())["comm_buffers"] == 4000


def planner(**sections: dict[str, Any]) -> Planner:
    cfg = config(**sections)
    info = model_info(cfg)
    assert info.blocks is not None
    return Planner(cfg, ModelShape(info.parameters, info.block_parameters, len(info.blocks), 0))


def test_auto_picks_a_smaller_micro_batch_and_keeps_the_global_batch() -> None:
    whole = planner(batch={"micro_size": 16}).plan(16, AcPolicy.none)
    p = planner(batch={"micro_size": "auto"})
    choice = choose(p, Budget(int(whole.peak * 0.6), "test"))
    assert choice.micro_size < 16 and 16 % choice.micro_size == 0
    assert choice.plan.peak <= whole.peak * 0.6 * 0.9
    assert "batch.micro_size=" in choice.reason
    cfg = resolved(p.cfg, choice)
    assert cfg.split().global_size == 16 and cfg.batch.micro_size == choice.micro_size


def test_ac_auto_prefers_no_recompute_and_recomputes_only_when_needed() -> None:
    p = planner(ac={"policy": "auto"}, batch={"micro_size": 16})
    assert choose(p, None).policy == AcPolicy.none
    none = p.plan(16, AcPolicy.none).peak
    full = p.plan(16, AcPolicy.full).peak
    tight = choose(p, Budget(int((none + full) / 2 / 0.9), "test"))
    assert tight.policy != AcPolicy.none and tight.plan.peak < none


def test_over_budget_names_the_largest_part_and_the_fixes_with_figures() -> None:
    p = planner(batch={"micro_size": 16})
    peak = p.plan(16, AcPolicy.none).peak
    with pytest.raises(ConfigError) as err:
        choose(p, Budget(int(peak * 0.8), "train.memory_budget=X"))
    text = str(err.value)
    assert "Largest part: activations" in text
    assert "batch.micro_size=" in text and "ac=" in text and "peak" in text
    assert "smallest achievable" in text


def test_an_impossible_budget_gives_the_smallest_achievable_peak() -> None:
    p = planner(batch={"micro_size": "auto"})
    with pytest.raises(ConfigError, match=r"No split fits.*smallest achievable peak is"):
        choose(p, Budget(1000, "train.memory_budget=1000"))


def test_the_cpu_meter_counts_live_tensors_and_what_a_step_creates() -> None:
    model = torch.nn.Linear(256, 256)
    meter = PeakMeter(torch.device("cpu"), model, steps=1)
    meter.before_step(1)
    scratch = torch.ones(1024, 1024)  # 4 MiB, freed before the window closes
    del scratch
    meter.after_step(1)
    assert meter.peak_bytes is not None
    assert meter.peak_bytes >= 4 * MIB + 256 * 256 * 4


def test_fake_model_config_is_the_builtin_gpt() -> None:
    assert isinstance(config().model, ModelConfig)


def test_a_transformers_model_is_probed_on_fake_tensors_too() -> None:
    pytest.importorskip("transformers")
    from launcher.memory.probe import _build, _line

    model = {"_target_": "launcher.models.hf.build_hf", "name": "hf", "seq_len": 64}
    model.update(config="tests/fixtures/tiny_gpt2.json", path=None, blocks=None)
    cfg = to_root_config({"model": model, "wandb": {"mode": "disabled"}})
    fake = probe_activations(cfg, [AcPolicy.none])[AcPolicy.none]
    real = _line(cfg, _build(cfg), [AcPolicy.none], "real")[AcPolicy.none]
    assert fake.method == "fake tensors"
    # Fake tensors cannot look at the attention mask's values, so transformers keeps a mask
    # its real path skips: a few per cent more, never less.
    assert real.peak(4) <= fake.peak(4) <= real.peak(4) * 1.1


def test_zero3_keeps_small_parameters_whole_and_the_gathered_ones_live() -> None:
    zero = {"reduce_bucket_size": 10, "stage3_param_persistence_threshold": 150}
    engine = {"name": "deepspeed", "zero_stage": 3, "extra": {"zero_optimization": zero}}
    cfg = config(engine=engine, parallel={"dp": 4})
    sizes = ModelShape(1000, 100, 8, 400, (400, 400, 100, 100))
    parts = state_parts(cfg, sizes)
    assert parts["parameters"] == 200 * 4 + 800 * 4 // 4
    assert parts["comm_buffers"] == 10 * 4 + 800 * 4 + 2 * 100 * 4


def test_a_slurm_job_is_planned_at_submission_against_the_given_budget() -> None:
    from launcher.plan import memory_budget
    from launcher.runners.slurm import SlurmRunner

    given = memory_budget(config(train={"memory_budget": "3MiB"}), SlurmRunner())
    assert given is not None and given.bytes == 3 * MIB
    assert memory_budget(config(train={"device": "cuda"}), SlurmRunner()) is None  # unseen here


def test_a_plan_more_than_15_percent_off_warns(caplog: pytest.LogCaptureFixture) -> None:
    from launcher.memory.peak import check_drift

    caplog.set_level("WARNING", logger="launcher")
    assert check_drift(100 * MIB, 110 * MIB) == pytest.approx(0.10)
    assert not [r for r in caplog.records if "memory plan" in r.getMessage()]
    assert check_drift(100 * MIB, 120 * MIB) == pytest.approx(0.20)
    assert any("the memory plan was +20% off" in r.getMessage() for r in caplog.records)
    assert check_drift(None, 5) is None
    caplog.clear()
    check_drift(100 * MIB, 70 * MIB, steady=False)  # one step: no optimizer state at its peak
    assert not caplog.records


def test_a_rank_refuses_an_unplanned_auto_config() -> None:
    from launcher.memory.auto import require_planned

    with pytest.raises(ConfigError, match="not planned"):
        require_planned(config(batch={"micro_size": "auto"}))
    require_planned(config(batch={"micro_size": 4}))
