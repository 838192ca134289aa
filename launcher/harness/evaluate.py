"""lm-evaluation-harness's own evaluator (`simple_evaluate`) on one checkpoint of a run, the model
being launcher/harness/model.py's: no export, any engine's checkpoint (DDP, FSDP, ZeRO-3) read
by the launcher's weight reader. Local task directories only (eval.harness.include_path): the
Hugging Face hub and datasets are told to stay offline."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import torch

from launcher.config.eval import HarnessConfig
from launcher.config.suggest import did_you_mean, suggestions
from launcher.errors import ConfigError
from launcher.serve.load import LoadedRun

INSTALL = "pip install 'launcher[eval]'"
BOOTSTRAP_ITERS = 100
"""Bootstrap draws for the stderr of metrics without a closed form (lm-eval's default, 100000,
takes minutes on CPU); mean metrics (acc, exact_match) use their closed form."""
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def require_lm_eval() -> None:
    """The `eval` extra: one error naming it when lm_eval does not import."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "eval.harness",
            f"needs lm-evaluation-harness (the eval extra), which is not installed "
            f"({exc.name or exc} is missing).",
            f"{INSTALL}.",
        ) from None


def go_offline() -> None:
    """No download: tasks and their data come from local files (an explicit 0 is kept)."""
    for name in OFFLINE:
        os.environ.setdefault(name, "1")


def include_dir(harness: HarnessConfig) -> Path | None:
    if harness.include_path is None:
        return None
    path = Path(harness.include_path).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(
            "eval.harness.include_path",
            f"{harness.include_path} is not a directory (looked for {path}).",
            "give the directory that holds your task YAML files "
            "(eval.harness.include_path=DIR, relative to where `launch` runs).",
        )
    return path


def task_manager(harness: HarnessConfig) -> Any:
    """lm-eval's TaskManager with include_path; every task named exists (else one error)."""
    from lm_eval.tasks import TaskManager

    if not harness.tasks:
        raise ConfigError(
            "eval.harness.tasks",
            "names no task.",
            "add 'eval.harness.tasks=[TASK,...]' (with eval.harness.include_path=DIR for yours).",
        )
    include = include_dir(harness)
    manager = TaskManager(include_path=str(include) if include else None)
    known = set(manager.all_tasks)
    unknown = [t for t in harness.tasks if t not in known]
    if unknown:
        near = suggestions(unknown[0], known)
        where = f" or in {include}" if include else " (no eval.harness.include_path given)"
        raise ConfigError(
            "eval.harness.tasks",
            f"lm-eval knows no task {unknown[0]!r} among its own{where}.",
            f"{did_you_mean(near)}name a task of `lm_eval ls tasks`, or the `task:` of a YAML "
            "file under eval.harness.include_path.",
        )
    return manager


def _samples(samples: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    keep = ("doc_id", "target", "filtered_resps")
    return {
        task: [{k: s.get(k) for k in keep} for s in sorted(rows, key=lambda s: s["doc_id"])]
        for task, rows in samples.items()
    }


def evaluate(
    run: LoadedRun, harness: HarnessConfig, manager: Any, device: torch.device
) -> dict[str, Any]:
    """The checkpoint's scores: eval/step_N.json's content."""
    import lm_eval
    from lm_eval import evaluator

    from launcher.harness.model import LauncherLM
    from launcher.serve.generate import build_engine

    serve = dataclasses.replace(run.cfg.serve, slots=harness.batch_size)
    engine = build_engine(run, serve, device)
    model = LauncherLM(run, engine, harness.max_gen_toks, seed=run.cfg.serve.seed)
    started = time.perf_counter()
    results = evaluator.simple_evaluate(
        model=model,
        tasks=list(harness.tasks),
        num_fewshot=harness.num_fewshot,
        limit=harness.limit,
        task_manager=manager,
        log_samples=harness.log_samples,
        bootstrap_iters=BOOTSTRAP_ITERS,
    )
    assert results is not None  # None only on ranks other than lm-eval's first
    record: dict[str, Any] = {
        "step": run.checkpoint.step,
        "checkpoint": str(run.checkpoint.path),
        "tasks": list(harness.tasks),
        "results": results["results"],
        "groups": results.get("groups", {}),
        "n-samples": results.get("n-samples", {}),
        "versions": results.get("versions", {}),
        "lm_eval": getattr(lm_eval, "__version__", None),
        "seconds": round(time.perf_counter() - started, 3),
    }
    if harness.log_samples:
        record["samples"] = _samples(results.get("samples", {}))
    return record
