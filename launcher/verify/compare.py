"""The comparison of a verified split with its reference: per step the loss and the gradient norm,
after step 1 every parameter's gradient; each gap relative, against the precision's tolerance."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from launcher.verify.results import RunResult
from launcher.verify.settings import Tolerance


def relative_gap(value: float | None, reference: float | None) -> float:
    """|value - reference| / |reference|; inf when one of them is missing (a skipped step)."""
    if value is None or reference is None:
        return 0.0 if value is None and reference is None else float("inf")
    return abs(value - reference) / max(abs(reference), 1e-12)


GRAD_FLOOR = 1e-3
"""A parameter's gradient gap is relative to its own norm, or to this fraction of the whole
model's gradient norm where that is larger: a gradient that cancels to rounding noise in exact
arithmetic (a key projection's bias: softmax ignores a shift shared by every key) has a norm of
about 1e-9 of the model's, and its noise, differently summed by any split, is 100% of it."""


def tensor_gap(value: torch.Tensor, reference: torch.Tensor, floor: float = 0.0) -> float:
    """||value - reference|| / max(||reference||, floor): the tensor's relative error
    (elementwise ratios blow up on entries that are nearly zero in both; one rounded entry of a
    tensor whose entries cancel does not decide it either)."""
    if value.shape != reference.shape:
        return float("inf")
    scale = max(float(reference.double().norm()), floor)
    error = float((value.double() - reference.double()).norm())
    if scale == 0.0:
        return 0.0 if error == 0.0 else float("inf")
    return error / scale


@dataclass
class Comparison:
    tolerance: Tolerance
    loss_gaps: list[float]
    grad_norm_gaps: list[float]
    param_gaps: dict[str, float]
    """Per parameter tensor: the gap of its step-1 gradient."""
    missing: list[str] = field(default_factory=list)
    """Parameters one run has and the other has not."""

    @property
    def worst_param(self) -> tuple[str | None, float]:
        if not self.param_gaps:
            return None, 0.0
        name = max(self.param_gaps, key=lambda n: self.param_gaps[n])
        return name, self.param_gaps[name]

    @property
    def loss_ok(self) -> bool:
        tol = self.tolerance.loss
        return all(g <= tol for g in [*self.loss_gaps, *self.grad_norm_gaps])

    @property
    def grads_ok(self) -> bool:
        return not self.missing and self.worst_param[1] <= self.tolerance.grad

    @property
    def certified(self) -> bool:
        return self.loss_ok and self.grads_ok and bool(self.loss_gaps)

    def failing_params(self) -> list[tuple[str, float]]:
        """Parameters over the tolerance, the worst first."""
        over = [(n, g) for n, g in self.param_gaps.items() if g > self.tolerance.grad]
        return sorted(over, key=lambda item: -item[1])


def compare(run: RunResult, reference: RunResult, tolerance: Tolerance) -> Comparison:
    steps = min(len(run.steps), len(reference.steps))
    loss_gaps = [relative_gap(run.steps[i].loss, reference.steps[i].loss) for i in range(steps)]
    norm_gaps = [
        relative_gap(run.steps[i].grad_norm, reference.steps[i].grad_norm) for i in range(steps)
    ]
    if len(run.steps) != len(reference.steps):
        loss_gaps.append(float("inf"))  # a run that stopped early is not the same run
    names = set(run.grads) | set(reference.grads)
    missing = sorted(names ^ (set(run.grads) & set(reference.grads)))
    whole = sum(float(g.double().norm()) ** 2 for g in reference.grads.values()) ** 0.5
    gaps = {
        name: tensor_gap(run.grads[name], reference.grads[name], GRAD_FLOOR * whole)
        for name in sorted(names)
        if name in run.grads and name in reference.grads
    }
    return Comparison(tolerance, loss_gaps, norm_gaps, gaps, missing)


def statistics_gaps(run: RunResult, reference: RunResult) -> dict[str, float]:
    """Per running-statistics buffer of a batch-dependent layer: its gap to the reference's."""
    return {
        name: tensor_gap(run.stats[name], reference.stats[name])
        for name in sorted(run.stats)
        if name in reference.stats
    }
