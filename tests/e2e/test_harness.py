"""`launch eval` and evaluation during training (issue 36): lm-eval's own evaluator on a run's
checkpoint through the launcher's weight reader and serving engine scores an FSDP2 checkpoint
(dp=2) as lm-eval's `hf` model scores the export of the same checkpoint (per-sample
log-likelihoods within 1e-4, the same generations and scores); a run with eval.harness.every logs
the scores at the right steps (metrics.jsonl, eval/step_N.json, tensorboard); a failing task
leaves a failure record at its step and training ends normally. The tasks are
tests/e2e/test_lm_eval.py's (local jsonl, no network).

ZeRO-3's checkpoint read as one model is tests/e2e/test_generate_cli.py's and test_export.py's
(gpt2_zero3); `launch eval` reads every engine's checkpoint through that same reader."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.data_sources import train_tokenizer, write_texts
from tests.e2e.test_lm_eval import DOCS, GEN, LENGTH, MC, _evaluate, _per_sample, _write_tasks
from tests.helpers import REPO, read_metrics, run_launch
from tests.installed import require

require("lm_eval")

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
    "checkpoint.every=2",
    "checkpoint.keep=1",  # the pending evaluation keeps its checkpoint from the pruning
    "wandb.mode=disabled",
    "eval.harness.log_samples=true",
]


def _write_broken(root: Path) -> None:
    """A task lm-eval knows whose data file is missing: it fails while evaluated."""
    (root / f"{BROKEN}.yaml").write_text(
        f"task: {BROKEN}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {root / 'missing.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{context}}"\ndoc_to_choice: choices\ndoc_to_target: label\n'
        "metric_list:\n  - metric: acc\n"
    )


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tasks' directory (the broken one's too)."""
    root = tmp_path_factory.mktemp("tasks")
    _write_broken(root)
    return _write_tasks(root)


@pytest.fixture(scope="module")
def common(tasks: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The training arguments both runs share."""
    root = tmp_path_factory.mktemp("harness")
    tok = train_tokenizer(root / "tok")
    texts = write_texts(root / "texts.jsonl", 200)
    data = ["data=hf", f"data.path={texts}", f"data.tokenizer={tok}", f"data.cache_dir={root}/c"]
    return [*TRAIN, *data, f"eval.harness.include_path={tasks}"]


@pytest.fixture(scope="module")
def fsdp(common: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FSDP2 at dp=2 evaluating its checkpoints while it trains (tensorboard too), exported."""
    fsdp = tmp_path_factory.mktemp("fsdp") / "run"
    run_launch(
        [
            *common,
            "parallel.dp=2",
            "engine=fsdp",
            f"eval.harness.every={EVERY}",
            f"eval.harness.tasks=[{MC},{GEN}]",
            "tracking.backends=[tensorboard]",
        ],
        fsdp,
    )
    run_launch(["export", str(fsdp)])
    return fsdp


@pytest.fixture(scope="module")
def failing(common: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rank, the default engine, its last step's checkpoint evaluated on the broken task
    alone: recording a failure is the same for every engine (launcher/worker/run.py: rank 0's
    Evaluations after each checkpoint), and each evaluation is a `launch eval` process of its
    own (torch, transformers and lm-eval imported: the dearest thing this module starts)."""
    run = tmp_path_factory.mktemp("failing") / "run"
    run_launch([*common, f"eval.harness.every={STEPS}", f"eval.harness.tasks=[{BROKEN}]"], run)
    return run


def _harness_lines(run: Path) -> list[dict[str, Any]]:
    return [m for m in read_metrics(run) if any(k.startswith("harness") for k in m)]


def test_training_logs_the_scores_of_its_checkpoints_at_their_steps(fsdp: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = fsdp
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


def test_a_failing_task_is_recorded_and_training_goes_on(failing: Path) -> None:
    run = failing
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS
    lines = _harness_lines(run)
    failed = [m for m in lines if "harness_error" in m]
    assert [m["step"] for m in failed] == [STEPS], lines
    assert all(BROKEN in m["harness_error"] or "missing" in m["harness_error"] for m in failed)


def test_launch_eval_scores_as_lm_evals_hf_model_on_the_export(
    fsdp: Path, tasks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # `launch eval` as a user types it, on a copy: its metrics.jsonl line would be a third one in
    # the run the test above reads; without the copy's eval/, the record read is this command's.
    run = tmp_path / "run"
    shutil.copytree(fsdp, run, ignore=shutil.ignore_patterns("eval"))
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
        tasks,
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
