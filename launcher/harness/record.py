"""Where an evaluation's scores go: <run dir>/eval/step_N.json (the whole result), one line in
metrics.jsonl at step N (the scores as flat `harness/<task>/<metric>` numbers, or
`harness_error`), and the run's trackers (wandb, tensorboard, mlflow) at step N."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from launcher.config.root import RootConfig
from launcher.logs import get_logger
from launcher.rundir import METRICS_FILE, harness_file
from launcher.userpath import open_own, replace_own

log = get_logger("eval")

PREFIX = "harness"


def flat_scores(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """lm-eval's {task: {"acc,none": 0.4, "acc_stderr,none": ...}} as harness/task/acc numbers
    (a filter other than "none" joins the name: harness/task/exact_match/strict-match)."""
    flat: dict[str, float] = {}
    for task, metrics in results.items():
        for key, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue  # the alias, "N/A" stderrs
            if not math.isfinite(float(value)):
                continue
            name, _, filtered = key.partition(",")
            suffix = "" if filtered in ("", "none") else f"/{filtered}"
            flat[f"{PREFIX}/{task}/{name}{suffix}"] = float(value)
    return flat


def write_record(cfg: RootConfig, run_dir: Path, step: int, record: dict[str, Any]) -> Path:
    """eval/step_N.json, the metrics.jsonl line and the trackers; the file written."""
    path = harness_file(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_own(path, json.dumps(record, indent=2, default=str) + "\n")
    line: dict[str, Any] = {"step": step}
    if record.get("error"):
        line["harness_error"] = record["error"]
    else:
        line.update(flat_scores(record.get("results", {})))
    append_metrics(run_dir, line)
    if len(line) > 1 and not record.get("error"):
        from launcher.harness.trackers import log_to_trackers

        log_to_trackers(cfg, run_dir, line)
    return path


def append_metrics(run_dir: Path, line: dict[str, Any]) -> None:
    """One line appended (O_APPEND, one write: training's own lines are never cut by it)."""
    fd = open_own(run_dir / METRICS_FILE)
    with open(fd, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def read_record(run_dir: Path, step: int) -> dict[str, Any] | None:
    try:
        data = json.loads(harness_file(run_dir, step).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
