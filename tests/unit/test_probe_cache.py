"""The activation probe is cached on disk by everything its answer depends on: the same model
plans again without probing, a changed model or policy probes anew, a damaged entry is probed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from launcher import host
from launcher.config.ac import AcPolicy
from launcher.config.load import to_root_config
from launcher.memory import probe


def config(**model: Any) -> Any:
    shape = {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 24, **model}
    return to_root_config({"model": shape, "wandb": {"mode": "disabled"}})


@pytest.fixture
def probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[AcPolicy]]:
    monkeypatch.setenv(host.CACHE_ENV, str(tmp_path))
    calls: list[list[AcPolicy]] = []
    real = probe._probe

    def counted(cfg: Any, policies: list[AcPolicy]) -> Any:
        calls.append(list(policies))
        return real(cfg, policies)

    monkeypatch.setattr(probe, "_probe", counted)
    return calls


def test_the_same_model_is_probed_once(probes: list[list[AcPolicy]]) -> None:
    first = probe.probe_activations(config(), [AcPolicy.none, AcPolicy.full])
    again = probe.probe_activations(config(), [AcPolicy.none, AcPolicy.full])
    assert again == first
    assert probes == [[AcPolicy.none, AcPolicy.full]]


def test_another_model_or_policy_is_probed_anew(probes: list[list[AcPolicy]]) -> None:
    probe.probe_activations(config(), [AcPolicy.none])
    probe.probe_activations(config(d_model=64), [AcPolicy.none])
    probe.probe_activations(config(), [AcPolicy.none, AcPolicy.selective])
    assert probes == [[AcPolicy.none], [AcPolicy.none], [AcPolicy.selective]]


def test_a_damaged_entry_is_probed_again(tmp_path: Path, probes: list[list[AcPolicy]]) -> None:
    probe.probe_activations(config(), [AcPolicy.none])
    for entry in (tmp_path / "probes").iterdir():
        entry.write_text("{not json")
    probe.probe_activations(config(), [AcPolicy.none])
    assert len(probes) == 2


def test_an_unwritable_cache_only_costs_a_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(host.CACHE_ENV, "/proc/launcher-cache")
    lines = probe.probe_activations(config(), [AcPolicy.none])
    assert lines[AcPolicy.none].peak(2) > 0
