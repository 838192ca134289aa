"""`launch verify`'s pure parts: the configs it runs, the gaps, the verdict, the diagnosis, the
certificate file, the SLURM lines and the sweep's certificate rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from launcher.config import to_root_config
from launcher.config.load import to_yaml
from launcher.errors import ConfigError
from launcher.runners.slurm import render_sbatch
from launcher.sweep.points import Status, read_point
from launcher.sweep.report import write_summary
from launcher.verify.command import refuse_training_run
from launcher.verify.compare import Comparison, compare, relative_gap, tensor_gap
from launcher.verify.diagnose import diagnose
from launcher.verify.probe import ModelEvidence
from launcher.verify.rank import switch_off_dropout
from launcher.verify.report import Certificate, write_certificate
from launcher.verify.results import RunResult, StepRecord
from launcher.verify.settings import (
    TOLERANCES,
    compared_precision,
    reference_config,
    split_config,
)


def _config(**sections: dict) -> object:
    base: dict = {"model": {"n_layer": 2, "d_model": 32, "n_head": 2, "dropout": 0.1}}
    base.update(sections)
    return to_root_config(base)


def _run(losses: list[float], grads: dict[str, torch.Tensor], dp: int = 1) -> RunResult:
    steps = [StepRecord(i + 1, loss, 1.0, 100, 0.1) for i, loss in enumerate(losses)]
    split = {"global_size": 8, "micro_size": 8 // dp, "grad_accum": 1, "dp": dp}
    return RunResult(split, dp, steps, grads, {})


def test_split_config_keeps_the_split_and_switches_off_what_a_comparison_cannot_have() -> None:
    cfg = _config(
        parallel={"dp": 2},
        batch={"global_size": 16, "grad_accum": 2},
        engine={"name": "fsdp"},
        ac={"policy": "full"},
        train={"steps": 1000, "precision": "bf16"},
        verify={"steps": 2},
    )
    split = split_config(cfg)
    assert split.split() == cfg.split()
    assert (split.engine.name, split.ac.policy) == (cfg.engine.name, cfg.ac.policy)
    assert split.model.dropout == 0.0 and split.train.steps == 2
    assert split.train.precision.value == "fp32"  # verify.precision=fp32 by default
    assert not split.checkpoint.enabled and split.wandb.mode.value == "disabled"

    reference = reference_config(split)
    shape = reference.split()
    assert (shape.dp, shape.grad_accum, shape.micro_size) == (1, 1, 16)
    assert reference.engine.name.value == "ddp" and reference.ac.policy.value == "none"
    assert reference_config(split, grad_accum=4).split().micro_size == 4


def test_precision_train_compares_in_the_training_precision() -> None:
    cfg = _config(
        train={"precision": "bf16"},
        verify={"precision": "train"},
        engine={"name": "deepspeed", "zero_stage": 2},
    )
    assert compared_precision(cfg) == "bf16"
    assert TOLERANCES["bf16"].grad > TOLERANCES["fp32"].grad == 1e-5
    # In bf16 the reference keeps the engine: its precision recipe is not the split's doing.
    reference = reference_config(split_config(cfg))
    assert (reference.engine.name.value, reference.engine.zero_stage) == ("deepspeed", 2)
    assert reference.train.precision.value == "bf16" and reference.split().dp == 1


def test_gaps() -> None:
    assert relative_gap(1.0, 1.0) == 0.0
    assert relative_gap(1.1, 1.0) == pytest.approx(0.1)
    assert relative_gap(None, 1.0) == float("inf")
    ref = torch.tensor([3.0, -4.0, 0.0])
    assert tensor_gap(ref + torch.tensor([0.0, 0.5, 0.0]), ref) == pytest.approx(0.1)
    assert tensor_gap(torch.zeros(3), torch.zeros(3)) == 0.0
    assert tensor_gap(torch.zeros(2), ref) == float("inf")  # shapes differ


def test_comparison_names_the_worst_parameter() -> None:
    ref = _run([2.0, 1.9], {"a": torch.ones(3), "b": torch.ones(2)})
    same = _run([2.0 * (1 + 1e-7), 1.9], {"a": torch.ones(3), "b": torch.ones(2) * (1 + 1e-7)})
    assert compare(same, ref, TOLERANCES["fp32"]).certified
    wrong = _run([2.0, 1.9], {"a": torch.ones(3) * 1.01, "b": torch.ones(2) * 1.2})
    result = compare(wrong, ref, TOLERANCES["fp32"])
    assert not result.certified and result.loss_ok and not result.grads_ok
    assert result.worst_param == ("b", pytest.approx(0.2))
    assert [n for n, _ in result.failing_params()] == ["b", "a"]
    # A gradient that is rounding noise in both runs (a key bias's) is judged on the model's
    # scale, not its own: certified.
    noise = {"a": torch.ones(3), "b": torch.ones(2), "k_bias": torch.full((2,), 1e-10)}
    flipped = {**noise, "k_bias": torch.full((2,), -1e-10)}
    assert compare(_run([2.0, 1.9], flipped), _run([2.0, 1.9], noise), TOLERANCES["fp32"]).certified
    missing = compare(_run([2.0, 1.9], {"a": torch.ones(3)}), ref, TOLERANCES["fp32"])
    assert missing.missing == ["b"] and not missing.certified


def _failed(loss_gaps: list[float], worst: float = 0.1) -> Comparison:
    return Comparison(TOLERANCES["fp32"], loss_gaps, [0.0] * len(loss_gaps), {"w": worst})


def test_a_reference_that_disagrees_with_itself_is_named_not_deterministic() -> None:
    cfg = split_config(_config())
    findings = diagnose(cfg, _failed([1e-4]), _failed([2e-5], 1e-4), ModelEvidence(), {})
    assert findings[0].cause == "deterministic"
    assert "not deterministic" in findings[0].message


def test_batch_dependent_layers_are_named_with_their_running_statistics() -> None:
    cfg = split_config(_config(batch={"global_size": 8, "grad_accum": 2}))
    evidence = ModelEvidence(batch_dependent={"net.bn": "BatchNorm1d"}, micro_valid=[[10, 10]])
    findings = diagnose(cfg, _failed([1e-3]), None, evidence, {"net.bn.running_mean": 0.5})
    assert findings[0].cause == "batch_dependent"
    assert "BatchNorm1d (net.bn)" in findings[0].message
    assert "net.bn.running_mean" in findings[0].message


def test_a_gradient_wrong_with_the_right_loss_and_uneven_tokens_blames_the_denominator() -> None:
    cfg = split_config(_config(batch={"global_size": 8, "grad_accum": 2}))
    evidence = ModelEvidence(micro_valid=[[40, 55]], positions_per_micro=96)
    findings = diagnose(cfg, _failed([1e-8, 1e-3]), None, evidence, {})
    assert findings[0].cause == "normalization" and "40..55" in findings[0].message


def test_random_draws_under_recompute_and_an_own_loss_are_reported() -> None:
    cfg = split_config(_config(ac={"policy": "full"}))
    evidence = ModelEvidence(draws_random=True, own_loss=True, micro_valid=[[5]])
    causes = [f.cause for f in diagnose(cfg, _failed([1e-3]), None, evidence, {})]
    assert causes == ["random_draws", "own_loss"]
    message = diagnose(cfg, _failed([1e-3]), None, evidence, {})[0].message
    assert "ac=full recomputes" in message


def test_nothing_found_still_names_the_largest_gap() -> None:
    cfg = split_config(_config())
    findings = diagnose(cfg, _failed([1e-3], 0.3), None, ModelEvidence(micro_valid=[[5]]), {})
    assert findings[0].cause == "unknown" and "w (gap 3.00e-01)" in findings[0].message


def test_certificate_file_is_strict_json(tmp_path: Path) -> None:
    cfg = split_config(_config())
    ref = _run([2.0, 1.9], {"a": torch.ones(3)})
    other = _run([2.0, 1.9], {"a": torch.ones(2)})  # another shape: a gap that cannot be measured
    comparison = compare(other, ref, TOLERANCES["fp32"])
    certificate = Certificate(cfg, other, ref, "", comparison, None, [])
    text = write_certificate(tmp_path, certificate).read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in verify.json"))
    assert data["certified"] is False and data["worst_parameter"] == {"name": "a", "gap": None}
    assert "| split | engine | policy |" in certificate.describe()


def test_switch_off_dropout_zeroes_modules_and_functional_rates() -> None:
    from launcher.models.gpt import GPT

    model = GPT(_config().model)
    switch_off_dropout(model)
    rates = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    functional = [
        m.dropout for m in model.modules() if isinstance(getattr(m, "dropout", None), float)
    ]
    assert rates and functional and set(rates + functional) == {0.0}


def test_a_started_training_run_is_refused(tmp_path: Path) -> None:
    refuse_training_run(tmp_path)  # empty: fine
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="holds a training run that has started"):
        refuse_training_run(tmp_path)


SLURM = {"cluster": {"name": "slurm", "python": "/opt/py"}, "parallel": {"dp": 2}}


def test_sbatch_verify_first_runs_the_split_in_the_allocation_before_the_step() -> None:
    run_dir = Path("/scratch/runs/demo")
    default = render_sbatch(to_root_config(SLURM), run_dir)
    first = render_sbatch(to_root_config({**SLURM, "verify": {"first": True}}), run_dir)
    assert "verify" not in default
    before, step = first.split("# --- the training step")
    assert "-m launcher.verify.worker" in before and "launcher.verify.job certify" in before
    assert step == default.split("# --- the training step")[1]  # the training step unchanged
    only = render_sbatch(to_root_config(SLURM), run_dir, verify_only=True)
    assert 'exit "$VERIFIED"' in only and "verify.sbatch" in only.splitlines()[1]
    for text in (first, only):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def _verify_point(sweep: Path, name: str, certified: bool) -> None:
    run = sweep / name
    run.mkdir(parents=True)
    cfg = to_root_config({"batch": {"global_size": 8, "grad_accum": 2}})
    (run / "config.yaml").write_text(to_yaml(cfg))
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text(f"- batch.grad_accum={name}\n")
    certificate = {
        "certified": certified,
        "steps": [{"loss_gap": 1e-7}, {"loss_gap": 2e-7 if certified else 3e-3}],
        "worst_parameter": {"name": "head.weight", "gap": 1e-7 if certified else 0.2},
        "findings": [] if certified else [{"cause": "unknown", "message": "no cause found"}],
    }
    (run / "verify.json").write_text(json.dumps(certificate))


def test_a_verify_sweep_has_one_certificate_row_per_point(tmp_path: Path) -> None:
    _verify_point(tmp_path, "1", certified=True)
    _verify_point(tmp_path, "2", certified=False)
    assert read_point(tmp_path / "1", "1").status == Status.ok
    assert read_point(tmp_path / "2", "2").status == Status.failed
    summary = write_summary(tmp_path)
    assert [r["verify"] for r in summary.rows] == ["certified", "NOT certified"]
    text = (tmp_path / "sweep_summary.md").read_text()
    rows = text.split("## Certificates")[1].splitlines()
    assert sum(line.startswith("| 1 |") or line.startswith("| 2 |") for line in rows) == 2
    assert "head.weight" in text and "NOT certified: no cause found" in text


def test_the_grid_script_covers_every_pair_of_values(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import itertools

    path = Path(__file__).resolve().parents[2] / "scripts" / "verify_grid.py"
    spec = importlib.util.spec_from_file_location("verify_grid", path)
    assert spec is not None and spec.loader is not None
    grid = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "verify_grid", grid)  # its dataclass looks itself up there
    spec.loader.exec_module(grid)
    rows = grid.pairwise_rows()
    for i, j in itertools.combinations(range(4), 2):
        covered = {(row[i], row[j]) for row in rows}
        assert covered == set(itertools.product(grid.AXES[i], grid.AXES[j]))
    assert len(rows) < 60  # far below the product's 960
