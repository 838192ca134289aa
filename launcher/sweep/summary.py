"""A sweep directory -> one row per point -> sweep_summary.csv, .md and .png in that directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from launcher.errors import LauncherError
from launcher.sweep.compare import Check, Comparison, Verdict, compare_points
from launcher.sweep.points import Point, Status, find_points

COLUMNS = (
    "point",
    "status",
    "label",
    "dp",
    "micro_size",
    "grad_accum",
    "global_size",
    "seed",
    "ac",
    "engine",
    "precision",
    "steps",
    "tokens_per_s",
    "peak_memory_bytes",
    "activation_bytes",
    "activation_peak_bytes",
    "final_loss",
    "reference",
    "common_steps",
    "max_rel_loss_diff",
    "max_rel_loss_diff_all_steps",
    "check",
    "note",
    "overrides",
    "verify",
    "verify_max_loss_gap",
    "verify_worst_parameter",
    "verify_worst_gap",
)
"""sweep_summary.csv's columns; an empty cell means the point did not report that figure."""


@dataclass
class SweepSummary:
    sweep_dir: Path
    check: Check
    points: list[Point]
    comparisons: list[Comparison]
    rows: list[dict[str, Any]]

    def count(self, status: Status) -> int:
        return sum(p.status == status for p in self.points)

    @property
    def differing(self) -> list[str]:
        return [
            p.name
            for p, c in zip(self.points, self.comparisons, strict=True)
            if c.verdict == Verdict.differs
        ]

    @property
    def passed(self) -> bool:
        """No point failed and none trained a different model than its reference."""
        return self.count(Status.failed) == 0 and not self.differing

    def headline(self) -> str:
        parts = [f"{len(self.points)} point(s): {self.count(Status.ok)} ok"]
        for status in (Status.failed, Status.stopped, Status.incomplete, Status.planned):
            if self.count(status):
                parts.append(f"{self.count(status)} {status.value}")
        text = ", ".join(parts) + "; "
        checked = sum(c.verdict in (Verdict.agrees, Verdict.differs) for c in self.comparisons)
        if not checked:
            text += "no two loss curves to compare"
        elif self.differing:
            text += (
                f"loss curves DIFFER from their reference ({self.check.describe()}): "
                f"{', '.join(self.differing)}"
            )
        else:
            text += (
                f"{checked} loss curve(s) compared with their reference, none differs "
                f"({self.check.describe()})"
            )
        return text


def _override_pairs(point: Point) -> dict[str, str]:
    pairs = {}
    for item in point.overrides:
        key, sep, value = item.lstrip("+~").partition("=")
        if sep and not key.startswith("hydra."):
            pairs[key] = _canonical(value)
    return pairs


def _canonical(value: str) -> str:
    """One spelling per value: a sweep records `False` where a command line said `false`."""
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    if parsed is None or isinstance(parsed, bool):
        return json.dumps(parsed)
    return value


def _labels(points: list[Point]) -> list[str]:
    """Each point by the overrides that vary across the sweep (e.g. `grad_accum=4
    ac.policy=full`)."""
    pairs = [_override_pairs(p) for p in points]
    keys: dict[str, None] = {}  # in order of first appearance
    for pair in pairs:
        keys.update(dict.fromkeys(pair))
    with_overrides = [pair for pair in pairs if pair]  # points run outside Hydra have none
    varying = [k for k in keys if len({pair.get(k) for pair in with_overrides}) > 1]
    tails = [k.rsplit(".", 1)[-1] for k in varying]
    short = {
        k: tail if tails.count(tail) == 1 and tail not in ("name", "policy", "path") else k
        for k, tail in zip(varying, tails, strict=True)
    }
    labels = []
    for point, pair in zip(points, pairs, strict=True):
        text = " ".join(f"{short[k]}={pair[k]}" for k in varying if k in pair)
        labels.append(text or _split_label(point))
    return labels


def _split_label(point: Point) -> str:
    dp, accum, micro = (point.value(k) for k in ("dp", "grad_accum", "micro_size"))
    if dp is None or accum is None or micro is None:
        return point.name
    return f"dp{dp} x {accum} x {micro} {point.value('ac') or ''}".strip()


def _row(point: Point, comparison: Comparison, label: str) -> dict[str, Any]:
    summary = point.summary or {}
    note = point.error or comparison.note
    return {
        "point": point.name,
        "status": point.status.value,
        "label": label,
        "dp": point.value("dp") or point.value("world_size") or point.setting("parallel.dp"),
        "micro_size": point.value("micro_size"),
        "grad_accum": point.value("grad_accum"),
        "global_size": point.value("global_size") or point.setting("batch.global_size"),
        "seed": point.setting("train.seed"),
        "ac": point.value("ac") or point.setting("ac.policy"),
        "engine": point.value("engine") or point.setting("engine.name"),
        "precision": point.value("precision") or point.setting("train.precision"),
        "steps": summary.get("steps", max(point.losses, default=None)),
        "tokens_per_s": point.steady_tokens_per_s,
        "peak_memory_bytes": summary.get("peak_memory_bytes"),
        "activation_bytes": summary.get("activation_bytes"),
        "activation_peak_bytes": summary.get("activation_peak_bytes"),
        "final_loss": summary.get(
            "final_loss", point.losses[max(point.losses)] if point.losses else None
        ),
        "reference": comparison.reference,
        "common_steps": comparison.common_steps or None,
        "max_rel_loss_diff": comparison.max_rel_diff,
        "max_rel_loss_diff_all_steps": comparison.max_rel_diff_all,
        "check": comparison.verdict.value,
        "note": note or "",
        "overrides": " ".join(point.overrides),
        **_certificate_cells(point.certificate),
    }


def _certificate_cells(certificate: dict[str, Any] | None) -> dict[str, Any]:
    """A `launch verify` point's certificate (verify.json): empty cells for a training point."""
    if certificate is None:
        return dict.fromkeys(COLUMNS[-4:])
    gaps = [s.get("loss_gap") for s in certificate.get("steps", [])]
    worst = certificate.get("worst_parameter") or {}
    return {
        "verify": "certified" if certificate.get("certified") else "NOT certified",
        "verify_max_loss_gap": max((g for g in gaps if g is not None), default=None),
        "verify_worst_parameter": worst.get("name"),
        "verify_worst_gap": worst.get("gap"),
        "verify_loss_gaps": gaps,
    }


def summarize(sweep_dir: Path, check: Check | None = None) -> SweepSummary:
    """Read every point of a sweep directory and compare their loss curves."""
    if not sweep_dir.is_dir():
        raise LauncherError(
            f"sweep directory {sweep_dir} does not exist. Fix: pass the directory that holds the "
            "sweep's run directories (hydra.sweep.dir)."
        )
    points = find_points(sweep_dir)
    if not points:
        raise LauncherError(
            f"no run directory found under {sweep_dir}. Fix: pass a sweep directory "
            "(hydra.sweep.dir), whose subdirectories hold config.yaml or error.txt."
        )
    check = check or Check()
    comparisons = compare_points(points, check)
    labels = _labels(points)
    rows = [_row(p, c, label) for p, c, label in zip(points, comparisons, labels, strict=True)]
    return SweepSummary(sweep_dir, check, points, comparisons, rows)
