"""train.compile=true through `launch`: the compile seconds on the progress line and in
summary.json, an eager run resuming a compiled run's checkpoint, and a model that fails to
compile stopping with one error that names the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import FAST, read_metrics, read_summary, run_launch

pytestmark = pytest.mark.e2e

TINY = ["train", "batch.global_size=8", *FAST, "model.d_model=32"]


def test_compiled_run_reports_compile_time_and_resumes_eagerly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # The CPU peak meter's first two steps run eagerly: step 3 compiles.
    proc = run_launch([*TINY, "train.steps=4", "train.compile=true"], run)
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("compile: the 2 blocks") for line in lines) == 1, proc.stdout
    # The compile time is reported once, on the line of the step that paid it (issue 33: step 2's
    # line had it, logged after step 3 ran), and it is part of that step's time.
    compile_lines = [line for line in lines if line.startswith("step ") and " compile " in line]
    assert len(compile_lines) == 1, proc.stdout
    assert compile_lines[0].startswith("step 3/4 "), proc.stdout
    shown = float(compile_lines[0].split(" compile ")[1].split("s")[0])
    step3 = next(m for m in read_metrics(run) if m["step"] == 3)
    assert 0 < shown <= step3["step_time_s"] + 0.05, (shown, step3)
    compiled = read_summary(run)
    assert compiled["compile_s"] > 0
    # The same run directory, eager, two more steps: the compiled checkpoint loads as it is.
    run_launch([*TINY, "train.steps=6"], run)
    resumed = read_summary(run)
    assert resumed["resumed_from_step"] == 4 and resumed["steps"] == 6
    assert resumed["compile_s"] is None


def test_a_model_that_fails_to_compile_is_one_error(tmp_path: Path) -> None:
    # No C++ compiler for inductor (and no cached kernels to hide it): compiling fails.
    env = {"CXX": str(tmp_path / "no-such-g++"), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    proc = run_launch(
        [*TINY, "train.steps=3", "train.compile=true"], tmp_path / "run", env=env, check=False
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert "train.compile: the model failed to compile" in errors[0]
    assert "Fix: set train.compile=false" in errors[0]
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) < 15, proc.stderr
