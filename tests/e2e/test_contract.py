"""The public contract (DESIGN.md, "Contract") is unchanged: each scenario's normalised snapshot
equals its golden file under tests/golden/contract/.

The goldens were generated from the code before the package restructure; a restructure must
leave them byte-for-byte valid. A difference fails with a unified diff (golden -> current code).
Only an intended contract change may regenerate them: python -m tests.e2e.contract_snapshot --write
(see contract_snapshot.py for what is normalised and why).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.contract_snapshot import (
    GOLDEN_DIR,
    SCENARIOS,
    Scenario,
    golden_path,
    render,
    snapshot,
    unified_diff,
)

pytestmark = pytest.mark.e2e


def _param(scenario: Scenario) -> Any:
    marks = [pytest.mark.multiproc] if scenario.multiproc else []
    return pytest.param(scenario, id=scenario.name, marks=marks)


def load_golden(name: str) -> dict[str, Any]:
    """The golden, checked to be a real snapshot (so the comparison cannot pass vacuously)."""
    path = golden_path(name)
    assert path.is_file(), (
        f"missing golden {path}; generate it from the reference code with "
        f"`python -m tests.e2e.contract_snapshot --write {name}`"
    )
    text = path.read_text()
    assert text.strip(), f"{path} is empty"
    golden = json.loads(text)
    assert golden.get("scenario") == name, f"{path} holds scenario {golden.get('scenario')!r}"
    assert "<RUN>" in text, f"{path} was not normalised (no <RUN> in it)"

    plan = golden["plan"]
    assert plan["exit_code"] == 0
    assert len(plan["stdout"]) >= 5, plan["stdout"]
    assert plan["plan.json"], f"{path}: empty plan.json"
    assert len(plan["config.yaml"]) > 20, f"{path}: config.yaml too short"
    assert "config.yaml" in plan["files"] and "plan.json" in plan["files"]

    if SCENARIOS[name].train:
        train = golden["train"]
        assert train["exit_code"] == 0
        assert train["stdout_plan"], f"{path}: no plan lines from launch train"
        steps = train["summary.json"]["steps"]
        assert steps > 0 and len(train["metrics.jsonl"]) == steps, f"{path}: metrics lines"
        for key in ("step", "loss", "tokens", "lr", "grad_norm", "tokens_per_s"):
            assert all(key in line for line in train["metrics.jsonl"]), key
        assert any(f.startswith("checkpoints/step_") for f in train["files"]), train["files"]
    return golden


def test_goldens_match_scenarios() -> None:
    """One golden per scenario, no stale ones."""
    assert GOLDEN_DIR.is_dir(), f"missing {GOLDEN_DIR}"
    assert sorted(p.stem for p in GOLDEN_DIR.glob("*.json")) == sorted(SCENARIOS)


@pytest.mark.parametrize("scenario", [_param(s) for s in SCENARIOS.values()])
def test_contract_unchanged(scenario: Scenario, tmp_path: Path) -> None:
    expected = render(load_golden(scenario.name))
    actual = render(snapshot(scenario, tmp_path, served=True))
    if actual != expected:
        pytest.fail(
            f"the public contract changed in scenario {scenario.name!r} "
            f"(- golden, + current code):\n{unified_diff(expected, actual, scenario.name)}",
            pytrace=False,
        )
