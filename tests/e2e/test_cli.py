"""The `launch` command end to end: usage, plan, errors, and the default job's outputs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import FAST, read_metrics, read_summary, run_launch

pytestmark = pytest.mark.e2e

METRIC_KEYS = {"step", "loss", "tokens", "lr", "grad_norm", "tokens_per_s"}
SUMMARY_KEYS = {
    "steps",
    "final_loss",
    "tokens_per_s",
    "peak_memory_bytes",
    "world_size",
    "grad_accum",
    "eval_accuracy",
}


def test_usage_lists_commands_and_keys() -> None:
    for args in ([], ["--help"]):
        out = run_launch(args).stdout
        assert (
            "train" in out and "plan" in out and "batch.grad_accum" in out and "parallel.dp" in out
        )
    bad = run_launch(["fly"], check=False)
    assert bad.returncode == 2 and "unknown command" in bad.stderr


def test_hydra_flags_keep_working() -> None:
    out = run_launch(["train", "--cfg", "job", "batch.grad_accum=2"]).stdout
    assert "grad_accum: 2" in out
    assert "model" in run_launch(["train", "--help"]).stdout


def test_plan_writes_files_and_starts_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = run_launch(
        ["plan", "parallel.dp=2", "batch.global_size=16", "batch.micro_size=4"], run_dir
    ).stdout
    assert "command     torchrun --standalone --nproc_per_node=2" in out  # run inside launch
    assert "grad_accum 2" in out and "384 positions" in out
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["grad_accum"] == 2 and plan["micro_size"] == 4 and plan["world_size"] == 2
    assert plan["runner"] == "torchrun" and "launcher.worker" in plan["command"]
    # The environment the runner adds is part of the plan too (unless this one already sets it).
    assert "OMP_NUM_THREADS" in plan["env"] or "OMP_NUM_THREADS" in os.environ
    assert (run_dir / "config.yaml").exists()
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "summary.json").exists()


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["batch.global_size=10", "batch.micro_size=3"], ["batch.global_size", "batch.micro_size"]),
        (["batch.foo=1"], ["batch.foo"]),
        (["parallel.nodes=2", "parallel.dp=2"], ["parallel.nodes", "cluster"]),
        (["data=text", "data.path=/nonexistent/file.txt"], ["data.path"]),
        (["ac=bogus"], ["ac/bogus"]),
        (["+optim.lrr=0.1"], ["optim.lrr"]),
        # train.precision=fp8: test_hydra_errors_are_one_line_in_the_launchers_words
    ],
)
def test_bad_override_fails_before_anything_runs(
    tmp_path: Path, overrides: list[str], names: list[str]
) -> None:
    run_dir = tmp_path / "run"
    for command in ("plan", "train"):
        proc = run_launch([command, *overrides], run_dir, check=False)
        assert proc.returncode == 2  # a config error: nothing was started
        for name in names:
            assert name in proc.stderr + proc.stdout
        assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.yaml").exists()


def test_default_job_writes_every_output(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = run_launch(
        ["train", "train.steps=10", "train.log_every=5", "wandb.mode=disabled"], run_dir
    ).stdout
    assert "step 10/10" in out and "done: 10 steps" in out
    for name in ("config.yaml", "plan.json", "metrics.jsonl", "summary.json"):
        assert (run_dir / name).exists(), name
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 11))
    assert all(m.keys() >= METRIC_KEYS for m in metrics)
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    summary = read_summary(run_dir)
    assert summary.keys() >= SUMMARY_KEYS
    assert summary["steps"] == 10 and summary["world_size"] == 1
    assert 0.0 <= summary["eval_accuracy"] <= 1.0
    # The exact-match evaluation says what it decodes, the key that sets it, and its progress.
    said = "eval: exact match of greedy decoding on 256 held-out problems (data.eval_problems=N"
    assert said in out
    assert re.search(r"^eval 256/256 problems, ", out, re.MULTILINE)


def test_plan_never_touches_a_run_that_has_started(trained_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)  # a run that has trained, shared with other tests
    config_before = (run_dir / "config.yaml").read_text()
    proc = run_launch(["plan", "train.steps=4", *FAST], run_dir, check=False)
    assert proc.returncode == 2 and "hydra.run.dir" in proc.stderr
    assert (run_dir / "config.yaml").read_text() == config_before


# Issue 17, item 1: Hydra's raw errors (several lines, advice to add `+`) in the launcher's words.
@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "batch.grad_acum=2",
            "error: batch.grad_acum: no such key. Fix: did you mean batch.grad_accum?",
        ),
        ("parallel.dp=two", "error: parallel.dp: 'two' is not a whole number. Fix:"),
        ("train.precision=fp8", "Fix: use one of: fp32, bf16, fp16."),
        ("model=huge", "error: model: no option 'huge'"),
        ("experiment=accumulation", "Fix: add it with +experiment=accumulation."),
        ("engine.extra.foo=1", "Fix: add it with +engine.extra.foo=1."),
        ("batch.grad_accum=1,2", "error: batch.grad_accum: several values (1,2) without -m."),
        ("x=[1", "cannot be read as an override"),
    ],
)
def test_hydra_errors_are_one_line_in_the_launchers_words(
    tmp_path: Path, override: str, line: str
) -> None:
    run_dir = tmp_path / "run"
    for command in ("plan", "train"):
        proc = run_launch([command, override], run_dir, check=False)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert line in proc.stderr
        assert " Fix: " in proc.stderr and "Traceback" not in proc.stderr
        assert "To append to your config use" not in proc.stderr + proc.stdout
        assert not run_dir.exists()


def test_a_bad_key_in_a_sweep_fails_before_any_point_runs(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = run_launch(
        ["train", "-m", "batch.grad_accum=1,2", "optim.lrr=0.1", f"hydra.sweep.dir={sweep_dir}"],
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: optim.lrr: no such key. Fix: did you mean optim.lr?")
    assert not sweep_dir.exists()
    bad_value = run_launch(
        ["plan", "-m", "train.precision=fp32,fp8", f"hydra.sweep.dir={sweep_dir}"], check=False
    )
    assert bad_value.returncode == 2 and "'fp8'" in bad_value.stderr
    assert not sweep_dir.exists()


def test_plus_keeps_adding_experiments_and_sweeps(tmp_path: Path) -> None:
    out = run_launch(["train", "--cfg", "job", "+experiment=accumulation"]).stdout
    assert "steps: 40" in out
    out = run_launch(["plan", "+sweep=splits", "--cfg", "hydra", "-p", "hydra.sweeper"]).stdout
    assert "parallel.dp" in out


# Issue 17, item 2: `launch train --help` named Hydra ("cli is powered by Hydra") and no key.
def test_help_lists_keys_with_their_documentation_groups_and_exit_statuses() -> None:
    for command in ("train", "plan"):
        out = run_launch([command, "--help"]).stdout
        assert out.startswith(f"launch {command} ") and "powered by Hydra" not in out
        assert (
            "batch.grad_accum=null" in out and "Micro-batches per rank per optimizer step." in out
        )
        assert "train.precision=fp32" in out and "model=" not in out.split("config keys")[0][:40]
        assert "model       custom, gpt2, hf, small, *tiny" in out
        assert "exit status:" in out and "\n  75  " in out and "\n  2   " in out
    # The values shown are those of the config the overrides compose.
    assert "model.n_layer=6 " in run_launch(["train", "--help", "model=small"]).stdout
    assert "Hydra" in run_launch(["train", "--hydra-help"]).stdout


# Issue 17, item 7: an empty hydra.run.dir wrote the run into the current directory.
def test_an_empty_run_directory_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from tests.helpers import LAUNCH, REPO

    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    for override in ("hydra.run.dir=", "hydra.run.dir=''", "hydra.run.dir=' '"):
        proc = subprocess.run(
            [*LAUNCH, "plan", override], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("error: hydra.run.dir: is empty") and "Fix:" in proc.stderr
        assert list(tmp_path.iterdir()) == []  # no .hydra/, config.yaml or plan.json here


# Issue 17, item 12: optim.lr=nan failed in torch after config.yaml and plan.json were written;
# optim.grad_clip=nan trained to a NaN loss and was reported as "holds a credential".
@pytest.mark.parametrize("override", ["optim.lr=nan", "optim.lr=inf", "optim.grad_clip=nan"])
def test_non_finite_numbers_fail_before_anything_is_written(tmp_path: Path, override: str) -> None:
    run_dir = tmp_path / "run"
    for command in ("plan", "train"):
        proc = run_launch([command, override, *FAST], run_dir, check=False)
        key = override.split("=")[0]
        assert proc.returncode == 2
        assert proc.stderr.startswith(f"error: {key}: must be a finite number"), proc.stderr
        assert "credential" not in proc.stderr and "Traceback" not in proc.stderr
        assert not (run_dir / "config.yaml").exists() and not (run_dir / "plan.json").exists()
