"""Through the `launch` command: every activation-checkpoint granularity trains the same loss curve
as no recompute, with dropout on, and reports its measured activation figures in summary.json.

One rank, in the test process (issue 43): what this shows, `ac=` reaching the model and recompute
redrawing dropout's masks, does not depend on the ranks. Every granularity meets dp=2 under every
engine in tests/multiproc/test_user_model_curves.py's grid; a dp=2 launch here cost about 8
CPU-seconds a row (two rank start-ups), a one-rank run in this process about 1.5."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import FAST, max_rel_diff, read_losses, read_summary, run_launch

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

# Four blocks so that sqrt makes 2 segments of 2 and every_n mixes kept and recomputed blocks;
# dropout 0.1 so that recompute has to redraw the same masks. Four steps: the losses of steps 2-4
# follow updates made from recomputed gradients (a wrong mask or gradient shows from step 2). One
# evaluation problem: the end-of-training evaluation is no part of what this shows.
MODEL = [
    *(a for a in FAST if not a.startswith(("model.n_layer=", "data.eval_problems="))),
    "model.n_layer=4",
    "model.dropout=0.1",
    "data.eval_problems=1",
]
STEPS = 4
RUN = [*MODEL, f"train.steps={STEPS}", "parallel.dp=1", "batch.global_size=8", "batch.micro_size=2"]
GRANULARITIES = ["full", "every_n", "sqrt", "selective"]


@pytest.fixture(scope="module")
def curves(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    runs: dict[str, Path] = {}
    for ac in ["none", *GRANULARITIES]:
        run_dir = tmp_path_factory.mktemp(f"ac_{ac}")
        run_launch(["train", *RUN, f"ac={ac}"], run_dir)
        runs[ac] = run_dir
    return runs


@pytest.mark.parametrize("ac", GRANULARITIES)
def test_loss_curve_equals_no_recompute(curves: dict[str, Path], ac: str) -> None:
    reference = read_losses(curves["none"])
    losses = read_losses(curves[ac])
    assert len(losses) == STEPS
    assert max_rel_diff(losses, reference) <= 1e-5


@pytest.mark.parametrize("ac", ["none", *GRANULARITIES])
def test_summary_reports_the_measured_activations(curves: dict[str, Path], ac: str) -> None:
    summary = read_summary(curves[ac])
    none = read_summary(curves["none"])
    assert summary["ac"] == ac and summary["world_size"] == 1
    assert 0 < summary["activation_bytes"] <= summary["activation_peak_bytes"]
    if ac == "none":
        assert summary["recompute_flops_ratio"] == 1.0
    elif ac == "selective":
        assert summary["recompute_flops_ratio"] <= 1.05
        assert summary["activation_bytes"] <= 0.7 * none["activation_bytes"]
    else:
        assert summary["recompute_flops_ratio"] > 1.0
        assert summary["activation_bytes"] < none["activation_bytes"]
