"""lm-evaluation-harness as the check of `launch serve` and `launch export` (issue 36): lm-eval's
own `local-completions` model against a real server on 127.0.0.1 and its `hf` model on the
export of the same run score a local multiple-choice task (loglikelihood) and a generation task
with the same per-sample log-likelihoods (within 1e-4), the same generations and the same
scores. No network: the task's data is a jsonl written here, the tokenizer is the export's."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.data_sources import sentences
from tests.e2e.serve_run import CHAT_TEMPLATE, shared_run, start_serve
from tests.helpers import run_launch
from tests.installed import require

require("lm_eval", "fastapi")

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.e2e

MC, GEN = "launcher_mc", "launcher_gen"
DOCS = 20
LENGTH = 32  # the run's model.seq_len


def _write_tasks(root: Path) -> Path:
    """Two tasks over one jsonl: 4 choices scored by loglikelihood, and greedy generation."""
    docs = []
    for i, text in enumerate(sentences(DOCS * 2, seed=7)):
        words = text.split()[:5]
        if len(words) < 3:
            continue
        right = " ".join(words[::-1])
        wrong = [" ".join(words), " ".join(words[1:] + words[:1]), " ".join(sorted(words))]
        docs.append(
            {
                "context": " ".join(words) + " :",
                "choices": [right, *wrong],
                "label": 0,
                "answer": right,
                "id": i,
            }
        )
    data = root / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs[:DOCS]))
    common = (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        'test_split: test\ndoc_to_text: "{{context}}"\n'
    )
    (root / f"{MC}.yaml").write_text(
        f"task: {MC}\n{common}output_type: multiple_choice\n"
        "doc_to_choice: choices\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    (root / f"{GEN}.yaml").write_text(
        f"task: {GEN}\n{common}output_type: generate_until\n"
        'doc_to_target: "{{answer}}"\ntarget_delimiter: " "\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 6\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n"
    )
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def export(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("lm-eval") / "export"
    run_launch(["export", str(run), "--output", str(directory)])
    return directory


@pytest.fixture(scope="module")
def server(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("lm-eval-serve") / "serve.log"
    base, proc = start_serve(run, log, "serve.slots=4")
    yield base
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()


def _evaluate(model: str, args: dict[str, Any], tasks: Path) -> dict[str, Any]:
    from lm_eval import evaluator
    from lm_eval.tasks import TaskManager

    results = evaluator.simple_evaluate(
        model=model,
        model_args=args,
        tasks=[MC, GEN],
        task_manager=TaskManager(include_path=str(tasks)),
        log_samples=True,
        bootstrap_iters=0,
        batch_size=1,
    )
    assert results is not None
    return dict(results)


def _per_sample(results: dict[str, Any], task: str) -> list[Any]:
    return [
        s["filtered_resps"] for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])
    ]


def test_server_and_export_score_alike_under_lm_eval(
    run: Path, export: Path, server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks = _write_tasks(tmp_path)
    assert AutoTokenizer.from_pretrained(str(export)).chat_template == CHAT_TEMPLATE  # issue 36

    hf = _evaluate(
        "hf",
        {"pretrained": str(export), "device": "cpu", "dtype": "float32", "max_length": LENGTH},
        tasks,
    )
    served = _evaluate(
        "local-completions",
        {
            "base_url": f"{server}/v1/completions",
            "model": run.name,
            "tokenizer": str(export),  # lm-eval's tokenizer: the export's, no network
            "tokenizer_backend": "huggingface",
            "tokenized_requests": True,
            "max_length": LENGTH,
            "max_retries": 1,
        },
        tasks,
    )

    mc_hf, mc_served = _per_sample(hf, MC), _per_sample(served, MC)
    assert len(mc_hf) == DOCS and len(mc_served) == DOCS
    for doc, (a, b) in enumerate(zip(mc_hf, mc_served, strict=True)):
        assert len(a) == len(b) == 4, doc
        for choice, (x, y) in enumerate(zip(a, b, strict=True)):
            assert y[0] == pytest.approx(x[0], abs=1e-4), (doc, choice)
            assert y[1] == x[1], (doc, choice)  # is_greedy
    gen_hf, gen_served = _per_sample(hf, GEN), _per_sample(served, GEN)
    assert gen_served == gen_hf and any(g[0] for g in gen_hf)
    for task, metric in ((MC, "acc,none"), (MC, "acc_norm,none"), (GEN, "exact_match,none")):
        assert served["results"][task][metric] == hf["results"][task][metric], (task, metric)
