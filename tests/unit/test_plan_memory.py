"""Without train.memory_budget, the plan's budget is the memory its ranks train in: a plan over it
is refused (issue 17: a global batch of 10**12 planned 423 billion MiB of activations without a
word). The machine's figure is faked here; tests/e2e/test_bad_day.py refuses against this
machine's real RAM."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.config.load import to_root_config
from launcher.errors import ConfigError
from launcher.memory import machine
from launcher.plan import Plan, build_plan, memory_budget
from launcher.runners import runner_for
from launcher.runners.inprocess import InProcessRunner

BASE: dict[str, Any] = {
    "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 24},
    "batch": {"global_size": 4096, "micro_size": 1024},
    "wandb": {"mode": "disabled"},
}


def config(**sections: dict[str, Any]) -> Any:
    merged = dict(BASE)
    for name, values in sections.items():
        merged[name] = {**merged.get(name, {}), **values}
    return to_root_config(merged)


def planned(tmp_path: Path, **sections: dict[str, Any]) -> Plan:
    cfg = config(**sections)
    return build_plan(cfg, tmp_path, runner_for(cfg))


def fake_ram(monkeypatch: pytest.MonkeyPatch, total: int) -> None:
    monkeypatch.setattr(machine.psutil, "virtual_memory", lambda: SimpleNamespace(total=total))


def test_cpu_ranks_share_the_machines_ram(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = {"device": "cpu"}
    fake_ram(monkeypatch, 2**50)
    one = planned(tmp_path, parallel={"dp": 1}, train=cpu)
    two = planned(tmp_path, parallel={"dp": 2}, batch={"micro_size": 512}, train=cpu)
    fake_ram(monkeypatch, int(one.planned_peak_bytes * 1.5))
    planned(tmp_path, parallel={"dp": 1}, train=cpu)  # fits
    fake_ram(monkeypatch, int(two.planned_peak_bytes * 1.5))  # one rank's worth, two ranks
    with pytest.raises(ConfigError) as refused:
        planned(tmp_path, parallel={"dp": 2}, batch={"micro_size": 512}, train=cpu)
    text = str(refused.value)
    assert text.startswith("batch.micro_size, ac, engine.zero_stage, parallel.dp: ")
    assert "more than this machine's RAM shared by 2 ranks" in text
    assert "batch.micro_size=256" in text  # a fix, with its figure
    assert "ac=" in text and "engine=fsdp" in text


def test_a_gpu_rank_has_one_gpus_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(train={"device": "cuda"})
    monkeypatch.setattr(machine, "_gpu_memory_bytes", lambda: 80 * 2**30)
    budget = memory_budget(cfg, InProcessRunner())
    assert budget is not None and budget.bytes == 80 * 2**30
    assert budget.source == "the memory of one GPU"
    monkeypatch.setattr(machine, "_gpu_memory_bytes", lambda: None)  # no NVML, no nvidia-smi
    assert memory_budget(cfg, InProcessRunner()) is None  # unknown: no budget


def test_slurm_nodes_are_checked_only_against_cluster_mem(tmp_path: Path) -> None:
    huge = {"global_size": 10**9, "micro_size": 10**9}
    planned(tmp_path / "a", cluster={"name": "slurm"}, batch=huge)  # no figure here
    planned(tmp_path / "b", cluster={"name": "slurm", "mem": "64G", "gpus_per_node": 4}, batch=huge)
    with pytest.raises(ConfigError, match=r"more than cluster.mem=64G per node \(64.00 GiB\)"):
        planned(tmp_path / "c", cluster={"name": "slurm", "mem": "64G"}, batch=huge)
