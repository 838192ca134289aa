"""What one verified run leaves in its directory, and reading it back.

<run dir>/verify/
    split/        the configured split: config.yaml, plan.json (and ds_config.json, ...) as a
                  training run has them, then steps.json, grads.pt, stats.pt from its rank 0
    reference/    the one-big-batch reference, the same files
    reference2/   the reference again, run only when the split was not certified (determinism)
<run dir>/verify.json   the certificate
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from launcher.config.batch import BatchSplit
from launcher.rundir import CERTIFICATE_FILE as CERTIFICATE_FILE  # verify.json, named there
from launcher.tracking.metrics import StepMetrics
from launcher.userpath import replace_own

VERIFY_DIR = "verify"
SPLIT_DIR, REFERENCE_DIR, REPEAT_DIR = "split", "reference", "reference2"
STEPS_FILE, GRADS_FILE, STATS_FILE = "steps.json", "grads.pt", "stats.pt"


@dataclass(frozen=True)
class StepRecord:
    step: int
    loss: float | None
    grad_norm: float | None
    tokens: int
    padding_fraction: float


@dataclass
class RunResult:
    """One verified run as rank 0 recorded it."""

    split: dict[str, int]
    """global_size, micro_size, grad_accum, dp."""
    world_size: int
    steps: list[StepRecord]
    grads: dict[str, torch.Tensor]
    """Full fp32 gradients of step 1, by parameter name."""
    stats: dict[str, torch.Tensor]
    """Running statistics of batch-dependent layers after the last step."""


def write_steps(
    out_dir: Path, metrics: list[StepMetrics], split: BatchSplit, world_size: int
) -> None:
    steps = [StepRecord(m.step, m.loss, m.grad_norm, m.tokens, m.padding_fraction) for m in metrics]
    data = {
        "split": asdict(split),
        "world_size": world_size,
        "steps": [asdict(s) for s in steps],
    }
    replace_own(out_dir / STEPS_FILE, json.dumps(data, indent=2) + "\n")


def read_result(out_dir: Path) -> RunResult:
    """What rank 0 wrote; FileNotFoundError when the run did not get to write it."""
    data: dict[str, Any] = json.loads((out_dir / STEPS_FILE).read_text(encoding="utf-8"))
    return RunResult(
        split=data["split"],
        world_size=data["world_size"],
        steps=[StepRecord(**s) for s in data["steps"]],
        grads=torch.load(out_dir / GRADS_FILE, weights_only=True),
        stats=torch.load(out_dir / STATS_FILE, weights_only=True),
    )


def clear_results(out_dir: Path) -> None:
    """A rerun of verify into the same directory never reads an older run's files."""
    for name in (STEPS_FILE, GRADS_FILE, STATS_FILE):
        (out_dir / name).unlink(missing_ok=True)
