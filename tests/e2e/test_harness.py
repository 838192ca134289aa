"""`launch eval` and evaluation during training (issue 36): lm-eval's own evaluator on a run's
checkpoint through the launcher's weight reader and serving engine scores an FSDP2 and a ZeRO-3
checkpoint (dp=2) as lm-eval's `hf` model scores the export of the same checkpoint (per-sample
log-likelihoods within 1e-4, the same generations and scores); a run with eval.harness.every logs
the scores at the right steps (metrics.jsonl, eval/step_N.json, tensorboard); a failing task
leaves a failure record at its step and training ends normally. The tasks are
tests/e2e/test_lm_eval.py's (local jsonl, no network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.data_sources import train_tokenizer, write_texts
from tests.e2e.test_lm_eval import DOCS, GEN, LENGTH, MC, _evaluate, _per_sample, _write_tasks
from tests.helpers import REPO, read_metrics, run_launch

pytest.importorskip("lm_eval")
pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

BROKEN = "launcher_broken"
STEPS = 4
EVERY = 2
MODEL = ["model=hf", f"model.config={REPO / 'tests/fixtures/tiny_llama.json'}", "model.seq_len=32"]
TRAIN = [
    "train",
    *MODEL,
    f"train.steps={STEPS}",
    "batch.global_size=4",
    "parallel.dp=2",
    "checkpoint.every=2",
    "checkpoint.keep=1",  # the pending evaluation keeps its checkpoint from the pruning
    "wandb.mode=disabled",
    "eval.harness.log_samples=true",
]
ENGINES = {"fsdp": ["engine=fsdp"], "zero3": ["engine=deepspeed", "engine.zero_stage=3"]}


def _write_broken(root: Path) -> None:
    """A task lm-eval knows whose data file is missing: it fails while evaluated."""
    (root / f"{BROKEN}.yaml").write_text(
        f"task: {BROKEN}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {root / 'missing.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{context}}"\ndoc_to_choice: choices\ndoc_to_target: label\n'
        "metric_list:\n  - metric: acc\n"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """FSDP2 evaluating its checkpoints while it trains (tensorboard too); ZeRO-3 with a task
    that fails at its last step, then `launch eval` on that checkpoint with the good tasks."""
    root = tmp_path_factory.mktemp("harness")
    tasks = _write_tasks(root)
    _write_broken(root)
    tok = train_tokenizer(root / "tok")
    texts = write_texts(root / "texts.jsonl", 200)
    data = ["data=hf", f"data.path={texts}", f"data.tokenizer={tok}", f"data.cache_dir={root}/c"]
    common = [*TRAIN, *data, f"eval.harness.include_path={tasks}"]
    fsdp, zero3 = root / "fsdp", root / "zero3"
    run_launch(
        [
            *common,
            *ENGINES["fsdp"],
            f"eval.harness.every={EVERY}",
            f"eval.harness.tasks=[{MC},{GEN}]",
            "tracking.backends=[tensorboard]",
        ],
        fsdp,
    )
    # The last step's checkpoint only (issue 43): each evaluation is a `launch eval` process of
    # its own (torch, transformers and lm-eval imported: the dearest thing this module starts),
    # and the FSDP2 run shows every chosen step evaluated; this one shows a failure recorded.
    run_launch(
        [
            *common,
            *ENGINES["zero3"],
            f"eval.harness.every={STEPS}",
            f"eval.harness.tasks=[{MC},{BROKEN}]",
        ],
        zero3,
    )
    for run in (fsdp, zero3):
        run_launch(["export", str(run)])
    return {"fsdp": fsdp, "zero3": zero3, "tasks": tasks}


def _harness_lines(run: Path) -> list[dict[str, Any]]:
    return [m for m in read_metrics(run) if any(k.startswith("harness") for k in m)]


def test_training_logs_the_scores_of_its_checkpoints_at_their_steps(runs: dict[str, Path]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = runs["fsdp"]
    lines = _harness_lines(run)
    assert sorted(m["step"] for m in lines) == [2, 4], lines  # they may end in any order
    for line in sorted(lines, key=lambda m: m["step"]):
        record = json.loads((run / "eval" / f"step_{line['step']}.json").read_text())
        assert record["step"] == line["step"] and "error" not in record
        assert line[f"harness/{MC}/acc"] == record["results"][MC]["acc,none"]
        assert f"harness/{GEN}/exact_match" in line
    assert not list((run / "eval").glob("*.pending"))
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert sorted(e.step for e in events.Scalars(f"harness/{MC}/acc")) == [2, 4]
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS


def test_a_failing_task_is_recorded_and_training_goes_on(runs: dict[str, Path]) -> None:
    run = runs["zero3"]
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS
    lines = _harness_lines(run)
    failed = [m for m in lines if "harness_error" in m]
    assert [m["step"] for m in failed] == [STEPS], lines
    assert all(BROKEN in m["harness_error"] or "missing" in m["harness_error"] for m in failed)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_launch_eval_scores_as_lm_evals_hf_model_on_the_export(
    engine: str, runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    run = runs[engine]
    if engine == "zero3":  # its own evaluations failed (the broken task): `launch eval` now
        run_launch(["eval", str(run), f"eval.harness.tasks=[{MC},{GEN}]"])
    record = json.loads((run / "eval" / f"step_{STEPS}.json").read_text())
    assert "error" not in record, record
    hf = _evaluate(
        "hf",
        {
            "pretrained": str(run / "export"),
            "device": "cpu",
            "dtype": "float32",
            "max_length": LENGTH,
        },
        runs["tasks"],
    )
    ours, theirs = record["samples"][MC], _per_sample(hf, MC)
    assert len(ours) == len(theirs) == DOCS
    for doc, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for choice, (x, y) in enumerate(zip(a["filtered_resps"], b, strict=True)):
            assert x[0] == pytest.approx(y[0], abs=1e-4), (doc, choice)
            assert bool(x[1]) == bool(y[1]), (doc, choice)
    assert [s["filtered_resps"] for s in record["samples"][GEN]] == _per_sample(hf, GEN)
    for task, metric in ((MC, "acc,none"), (MC, "acc_norm,none"), (GEN, "exact_match,none")):
        assert record["results"][task][metric] == hf["results"][task][metric], (task, metric)
