"""Which points must have trained the same model, and whether they did.

Two points must log the same loss curve when everything that defines the training problem is the
same: the global batch, the seed, the model, the data, the optimizer, the steps, the precision.
How a global batch is computed (dp, micro size, accumulation, recompute, engine, where it runs)
must not matter. Each point is compared with the first point of the sweep with the same problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from launcher.sweep.points import Point

DEFAULT_TOLERANCE = 1e-5
"""Largest relative loss difference accepted between splits (fp32, dropout 0)."""

DEFAULT_STEPS = 10
"""Steps compared. Between correct splits the difference starts at fp32 rounding (1e-7) but the
optimizer amplifies it: on the built-in task it passes 1e-5 after about 20 steps, as warmup ends,
while a wrong normalization passes 1e-5 by the third step (and 1e-1 by step 40). So the first
steps tell the two apart; the difference over every step is reported too."""


@dataclass(frozen=True)
class Check:
    """How loss curves are judged."""

    tolerance: float = DEFAULT_TOLERANCE
    steps: int = DEFAULT_STEPS
    """Compare the first `steps` common steps (0: all of them)."""

    def describe(self) -> str:
        window = f"the first {self.steps} common steps" if self.steps else "every common step"
        return f"> {self.tolerance:g} relative over {window}"


HOW_KEYS = (
    "parallel",
    "batch.micro_size",
    "batch.grad_accum",
    "ac",
    "engine",
    "cluster",
    "wandb",
    "checkpoint",
    "debug",  # the negative control must be compared with the correct runs, not apart from them
    "train.log_every",
    "train.device",
    "train.max_restarts",
    "train.hang_timeout",
    "train.resume",
    "train.peak_flops",
    "data.eval_problems",
    "model.name",
)
"""Config keys (and sections) that say how a step is computed, not what is trained."""


class Verdict(str, Enum):
    reference = "reference"
    """The first point of its problem: the others are compared with it."""
    agrees = "agrees"
    differs = "DIFFERS"
    """Above the tolerance: this split trained a different model."""
    unchecked = "unchecked"
    """Not exact by design (bf16/fp16, dropout): the difference is shown, not judged."""
    none = ""
    """No loss curve to compare (failed before training, or not started)."""


@dataclass
class Comparison:
    reference: str | None = None
    """Name of the point this one is compared with (its own for a reference)."""
    common_steps: int = 0
    """Steps compared (at most Check.steps)."""
    max_rel_diff: float | None = None
    """Largest relative difference over the compared steps (what is judged)."""
    max_rel_diff_all: float | None = None
    """Largest relative difference over every common step (shown, not judged)."""
    verdict: Verdict = Verdict.none
    note: str = ""


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _is_how(key: str) -> bool:
    return any(key == how or key.startswith(how + ".") for how in HOW_KEYS)


def problem_key(point: Point) -> str | None:
    """What the point trains, as a comparable string; None without a config."""
    if point.config is None:
        return None
    flat = {k: v for k, v in _flatten(point.config).items() if not _is_how(k)}
    # global_size may be null in config.yaml (derived from micro x accum x dp): use the resolved
    # one.
    flat["batch.global_size"] = point.value("global_size") or flat.get("batch.global_size")
    return json.dumps(flat, sort_keys=True, default=str)


def max_rel_diff(
    curve: dict[int, float], reference: dict[int, float], steps: int = 0
) -> tuple[int, float | None]:
    """(steps compared, largest |loss - reference| / |reference| over them): the first `steps`
    steps both curves logged (0: all of them)."""
    common = sorted(set(curve) & set(reference))
    if steps:
        common = common[:steps]
    if not common:
        return 0, None
    worst = max(abs(curve[s] - reference[s]) / max(abs(reference[s]), 1e-12) for s in common)
    return len(common), worst


def _not_exact(point: Point) -> str:
    """Why this point's curve is not expected to match to fp32 rounding ('' when it is)."""
    precision = point.setting("train.precision")
    if precision not in (None, "fp32"):
        return f"{precision} is not exact across splits"
    dropout = point.setting("model.dropout")
    if dropout:
        return f"dropout {dropout} differs across splits"
    return ""


def compare_points(points: list[Point], check: Check | None = None) -> list[Comparison]:
    """One Comparison per point, in order: each curve against the first curve of its problem."""
    check = check or Check()
    references: dict[str, Point] = {}
    result = []
    for point in points:
        key = problem_key(point)
        curve = point.losses
        if key is None or not curve:
            result.append(Comparison())
            continue
        ref = references.setdefault(key, point)
        if ref is point:
            compared = min(len(curve), check.steps) if check.steps else len(curve)
            result.append(Comparison(point.name, compared, 0.0, 0.0, Verdict.reference))
            continue
        common, worst = max_rel_diff(curve, ref.losses, check.steps)
        comparison = Comparison(ref.name, common, worst, max_rel_diff(curve, ref.losses)[1])
        why_not = _not_exact(point) or _not_exact(ref)
        if worst is None:
            comparison.note = "no step in common with the reference"
        elif why_not:
            comparison.verdict, comparison.note = Verdict.unchecked, why_not
        else:
            comparison.verdict = Verdict.differs if worst > check.tolerance else Verdict.agrees
        result.append(comparison)
    return result
