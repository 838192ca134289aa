"""Reading a sweep directory: one Point per run directory, from the files every run writes."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from launcher.rundir import (
    CONFIG_FILE,
    ERROR_FILE,
    HYDRA_DIR,
    METRICS_FILE,
    PLAN_FILE,
    STOPPED_FILE,
    SUMMARY_FILE,
)
from launcher.tracking.run_end import HUNG_STATUS

CONFIG, PLAN, SUMMARY, METRICS, STOPPED, OVERRIDES = (
    CONFIG_FILE,
    PLAN_FILE,
    SUMMARY_FILE,
    METRICS_FILE,
    STOPPED_FILE,  # written by a run stopped on a signal
    f"{HYDRA_DIR}/overrides.yaml",
)
CERTIFICATE = "verify.json"  # `launch verify -m`: each point's certificate (launcher/verify/)


class Status(str, Enum):
    ok = "ok"
    """summary.json written: the run ended."""
    failed = "failed"
    """error.txt written (bad config, crashed or non-zero job)."""
    stopped = "stopped"
    """Stopped on a signal after a checkpoint (stopped.json, or summary.json says so); resumable."""
    incomplete = "incomplete"
    """Metrics but no summary yet: still running, or killed."""
    planned = "planned"
    """Config and plan only: `launch plan -m`, or a SLURM job not started yet."""


@dataclass
class Point:
    """One run directory of a sweep, as its files describe it."""

    name: str
    path: Path
    status: Status
    overrides: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    certificate: dict[str, Any] | None = None
    """verify.json of a `launch verify` point."""

    def value(self, key: str) -> Any:
        """A figure from summary.json, else plan.json, else config.yaml (dotted key); None if
        absent."""
        for source in (self.summary, self.plan):
            if source and source.get(key) is not None:
                return source[key]
        return self.setting(key)

    def setting(self, dotted: str) -> Any:
        """A config.yaml value by dotted key (e.g. train.seed); None if absent."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    @property
    def losses(self) -> dict[int, float]:
        """Logged loss by optimizer step (skipped steps left out; a resumed run's repeats: the
        last)."""
        return {
            int(m["step"]): float(m["loss"])
            for m in self.metrics
            if m.get("loss") is not None and m.get("step") is not None
        }

    @property
    def steady_tokens_per_s(self) -> float | None:
        """Mean tokens per step / median step time, leaving out the first step (it pays one-off
        costs; in an in-process sweep the first point also warms the process up). The median keeps
        a step slowed by a checkpoint or a busy machine from moving the figure. summary.json's
        tokens_per_s when metrics.jsonl has too few timed steps."""
        timed = [m for m in self.metrics if m.get("step_time_s") and m.get("tokens") is not None]
        later = timed[1:]
        if later:
            seconds = statistics.median(float(m["step_time_s"]) for m in later)
            return statistics.fmean(int(m["tokens"]) for m in later) / seconds
        figure = (self.summary or {}).get("tokens_per_s")
        return float(figure) if figure is not None else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a killed job
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_point(path: Path, name: str) -> Point:
    summary = _read_json(path / SUMMARY)
    error_file = path / ERROR_FILE
    error = None
    if error_file.is_file():
        lines = error_file.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        error = lines[0] if lines else "failed (error.txt is empty)"
    metrics = _read_metrics(path / METRICS)
    config = _read_yaml(path / CONFIG)
    plan = _read_json(path / PLAN)
    if error is not None:
        status = Status.failed
    elif summary is not None:
        ended = str(summary.get("status"))
        status = {"stopped": Status.stopped, HUNG_STATUS: Status.failed}.get(ended, Status.ok)
        if ended == HUNG_STATUS:
            error = f"hung: see {(summary.get('hang') or {}).get('report', 'hang_report.txt')}"
    elif (path / STOPPED).is_file():
        status = Status.stopped
    elif metrics:
        status = Status.incomplete
    else:
        status = Status.planned
    overrides = _read_yaml(path / OVERRIDES)
    certificate = _read_json(path / CERTIFICATE)
    if certificate is not None:  # a `launch verify` point: its verdict is its status
        certified = bool(certificate.get("certified"))
        status = Status.ok if certified else Status.failed
        findings = certificate.get("findings") or [{}]
        error = None if certified else f"NOT certified: {findings[0].get('message', '')}".strip()
    return Point(
        name=name,
        path=path,
        status=status,
        overrides=[str(o) for o in overrides] if isinstance(overrides, list) else [],
        config=config if isinstance(config, dict) else None,
        plan=plan,
        summary=summary,
        metrics=metrics,
        error=error,
        certificate=certificate,
    )


def _is_point(path: Path) -> bool:
    return any((path / name).exists() for name in (CONFIG, ERROR_FILE, OVERRIDES))


def _job_order(path: Path, name: str) -> tuple[int, float, str]:
    """Hydra's job number (the order points ran in), from the name or .hydra/hydra.yaml."""
    if name.isdigit():
        return (0, int(name), name)
    hydra = _read_yaml(path / HYDRA_DIR / "hydra.yaml")
    try:
        return (0, int(hydra["hydra"]["job"]["num"]), name)
    except (TypeError, KeyError, ValueError):
        return (1, 0, name)


def _candidates(folder: Path, depth: int) -> list[Path]:
    """Point directories at or below folder; a point's own subfolders (wandb, checkpoints) are not
    searched."""
    found = []
    for child in sorted(folder.iterdir()):
        if not child.is_dir() or child.name.startswith("."):
            continue
        if _is_point(child):
            found.append(child)
        elif depth > 1:
            found.extend(_candidates(child, depth - 1))
    return found


def find_points(sweep_dir: Path) -> list[Point]:
    """Every run directory under the sweep directory, in the order the sweep ran them."""
    named = [(path, path.relative_to(sweep_dir).as_posix()) for path in _candidates(sweep_dir, 3)]
    named.sort(key=lambda item: _job_order(*item))
    return [read_point(path, name) for path, name in named]
