"""A plan whose memory estimate exceeds the memory its ranks train in is refused (issue 17: a
global batch of 10**12 planned 423 billion MiB of activations without a word). The machine's
figure is faked here; tests/e2e/test_bad_day.py refuses against this machine's real RAM."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher import plan as plan_module
from launcher.config.load import to_root_config
from launcher.errors import ConfigError
from launcher.plan import Plan, build_plan, check_memory
from launcher.runners import runner_for

GIB = 2**30


def planned(tmp_path: Path, check: bool = False, **sections: dict[str, Any]) -> Plan:
    base: dict[str, Any] = {
        "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 24},
        "batch": {"global_size": 4096, "micro_size": 1024},
        "wandb": {"mode": "disabled"},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    cfg = to_root_config(base)
    if not check:  # build the plan against a machine that has room, then check it explicitly
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(plan_module, "machine_memory", lambda cfg, runner: None)
            result = build_plan(cfg, tmp_path, runner_for(cfg))
        return result
    return build_plan(cfg, tmp_path, runner_for(cfg))


def need_per_rank(plan: Plan) -> int:
    est = plan.memory_estimate
    return est["parameters"] + est["gradients"] + est["optimizer"] + est["activations_peak"]


def fake_ram(monkeypatch: pytest.MonkeyPatch, total: int) -> None:
    monkeypatch.setattr(plan_module.psutil, "virtual_memory", lambda: SimpleNamespace(total=total))


def test_cpu_ranks_share_the_machines_ram(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = planned(tmp_path, parallel={"dp": 1}, train={"device": "cpu"})
    two = planned(tmp_path, parallel={"dp": 2}, batch={"micro_size": 512}, train={"device": "cpu"})
    fake_ram(monkeypatch, int(need_per_rank(one) * 1.5))
    planned(tmp_path, check=True, parallel={"dp": 1}, train={"device": "cpu"})  # fits
    fake_ram(monkeypatch, int(need_per_rank(two) * 1.5))  # one rank's worth, two ranks
    with pytest.raises(ConfigError) as refused:
        planned(
            tmp_path,
            check=True,
            parallel={"dp": 2},
            batch={"micro_size": 512},
            train={"device": "cpu"},
        )
    text = str(refused.value)
    assert text.startswith("batch.micro_size, ac, engine.zero_stage, parallel.dp: ")
    assert "per rank x 2 ranks" in text and "more than this machine's RAM" in text
    assert "batch.micro_size=256 or less" in text  # the largest power of two that fits
    assert "ac=full" in text and "engine.zero_stage=3" in text


def test_a_gpu_rank_has_one_gpus_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = planned(tmp_path, train={"device": "cuda"})
    cfg = to_root_config(
        {
            "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 24},
            "batch": {"global_size": 4096, "micro_size": 1024},
            "train": {"device": "cuda"},
        }
    )
    monkeypatch.setattr(plan_module, "_gpu_memory_bytes", lambda: need_per_rank(plan) // 2)
    with pytest.raises(ConfigError, match="more than the memory of one GPU"):
        check_memory(plan, cfg)
    monkeypatch.setattr(plan_module, "_gpu_memory_bytes", lambda: None)  # no NVML, no nvidia-smi
    check_memory(plan, cfg)  # unknown: not refused


def test_slurm_nodes_are_checked_only_against_cluster_mem(tmp_path: Path) -> None:
    huge = {"global_size": 10**9, "micro_size": 10**9}
    planned(tmp_path / "a", check=True, cluster={"name": "slurm"}, batch=huge)  # no figure here
    planned(
        tmp_path / "b",
        check=True,
        cluster={"name": "slurm", "mem": "64G", "gpus_per_node": 4},
        batch=huge,
    )
    with pytest.raises(ConfigError, match=r"more than cluster.mem=64G per node \(64.0 GiB\)"):
        planned(tmp_path / "c", check=True, cluster={"name": "slurm", "mem": "64G"}, batch=huge)
