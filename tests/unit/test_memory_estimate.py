"""`launch plan`'s activation estimates per policy agree with what a run measures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from launcher.config.ac import AcPolicy
from launcher.config.load import to_root_config
from launcher.config.root import RootConfig
from launcher.models import GPT
from launcher.plan import build_plan
from launcher.recompute.estimate import estimate_activations
from launcher.recompute.measure import measure_micro_batch
from launcher.recompute.policies import build_runner
from launcher.runners import runner_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config(policy: AcPolicy, n_layer: int = 6) -> RootConfig:
    return to_root_config(
        {
            "model": {"n_layer": n_layer, "n_head": 2, "d_model": 64, "seq_len": 24},
            "ac": {"policy": policy.value, "every_n": 2},
            "batch": {"global_size": 8, "micro_size": 4},
        }
    )


@pytest.mark.parametrize("policy", AcPolicy.granularities())
def test_estimate_matches_the_cpu_measurement(policy: AcPolicy) -> None:
    cfg = config(policy)
    torch.manual_seed(0)
    model = GPT(cfg.model)
    g = torch.Generator().manual_seed(1)
    inputs, targets = (torch.randint(0, 256, (4, 24), generator=g) for _ in range(2))
    measured = measure_micro_batch(model, inputs, targets)  # without recompute: the FLOPs base
    model.run_blocks = build_runner(cfg.ac, model.blocks)
    model.zero_grad(set_to_none=True)
    with_policy = measure_micro_batch(model, inputs, targets)
    estimate = estimate_activations(cfg, 4, policy)
    assert estimate.activation_bytes == pytest.approx(with_policy.activation_bytes, rel=0.01)
    assert estimate.activation_peak_bytes == pytest.approx(
        with_policy.activation_peak_bytes, rel=0.10
    )
    assert estimate.recompute_flops_ratio == pytest.approx(
        with_policy.flops / measured.flops, abs=0.005
    )


def test_plan_reports_every_policy_and_the_chosen_one(tmp_path: Path) -> None:
    cfg = config(AcPolicy.sqrt, n_layer=16)
    plan = build_plan(cfg, tmp_path, runner_for(cfg))
    assert list(plan.activation_estimates) == [p.value for p in AcPolicy.granularities()]
    chosen = plan.activation_estimates["sqrt"]
    # plan.json's memory_estimate holds the probe's figures; the formula agrees with them
    assert plan.memory_estimate["activations"] == plan.memory_plan["activation_bytes"]
    assert plan.memory_estimate["activations"] == pytest.approx(chosen["activation_bytes"], rel=0.1)
    saved = {name: e["activation_bytes"] for name, e in plan.activation_estimates.items()}
    assert saved["sqrt"] < saved["full"] < saved["every_n"] < saved["none"]
    assert saved["selective"] < 0.7 * saved["none"]
    assert "*sqrt" in plan.describe()
