"""The certificate: the printed table and verify.json in the run directory."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.root import RootConfig
from launcher.engines import engine_spec
from launcher.userpath import replace_own
from launcher.verify.compare import Comparison
from launcher.verify.diagnose import Finding
from launcher.verify.results import CERTIFICATE_FILE, RunResult


def split_name(split: dict[str, int]) -> str:
    tp = f" x tp{split['tp']}" if split.get("tp", 1) > 1 else ""
    pp = f" x pp{split['pp']}" if split.get("pp", 1) > 1 else ""
    return f"dp{split['dp']}{tp}{pp} x acc{split['grad_accum']} x micro{split['micro_size']}"


def engine_name(cfg: RootConfig) -> str:
    return engine_spec(cfg.engine.name).short_name(cfg)


def _gap(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.1e}"


@dataclass
class Certificate:
    split_cfg: RootConfig
    split: RunResult
    reference: RunResult
    reference_note: str
    comparison: Comparison
    deterministic: bool | None
    """None: not checked (the split was certified, so the reference was run once)."""
    findings: list[Finding] = field(default_factory=list)

    @property
    def certified(self) -> bool:
        return self.comparison.certified

    def row(self) -> dict[str, str]:
        """One line of the table (and of a sweep summary)."""
        name, gap = self.comparison.worst_param
        return {
            "split": split_name({**self.split.split, **self._model_ranks()}),
            "engine": engine_name(self.split_cfg),
            "policy": self.split_cfg.ac.policy.value,
            "loss gap per step": " ".join(_gap(g) for g in self.comparison.loss_gaps),
            "worst parameter": name or "-",
            "gap": _gap(gap),
            "verdict": "certified" if self.certified else "NOT certified",
        }

    def _model_ranks(self) -> dict[str, int]:
        parallel = self.split_cfg.parallel
        return {"tp": parallel.tp, "pp": parallel.pp}

    def table(self) -> str:
        row = self.row()
        header = "| " + " | ".join(row) + " |"
        rule = "| " + " | ".join("---" for _ in row) + " |"
        return "\n".join([header, rule, "| " + " | ".join(row.values()) + " |"])

    def to_json(self) -> dict[str, Any]:
        cmp = self.comparison
        name, gap = cmp.worst_param
        steps = []
        for i, (mine, ref) in enumerate(zip(self.split.steps, self.reference.steps, strict=False)):
            steps.append(
                {
                    "step": mine.step,
                    "loss": mine.loss,
                    "reference_loss": ref.loss,
                    "loss_gap": cmp.loss_gaps[i],
                    "grad_norm": mine.grad_norm,
                    "reference_grad_norm": ref.grad_norm,
                    "grad_norm_gap": cmp.grad_norm_gaps[i],
                }
            )
        return {
            "certified": self.certified,
            "split": {
                **self.split.split,
                **({"tp": tp} if (tp := self.split_cfg.parallel.tp) > 1 else {}),
                **({"pp": pp} if (pp := self.split_cfg.parallel.pp) > 1 else {}),
                "engine": engine_name(self.split_cfg),
            },
            "engine": self.split_cfg.engine.name.value,
            "zero_stage": engine_spec(self.split_cfg.engine.name).zero_stage(self.split_cfg),
            "policy": self.split_cfg.ac.policy.value,
            "precision": cmp.tolerance.precision,
            "tolerance": {"loss": cmp.tolerance.loss, "grad": cmp.tolerance.grad},
            "reference": {**self.reference.split, "note": self.reference_note},
            "steps": steps,
            "worst_parameter": {"name": name, "gap": gap},
            "parameters": cmp.param_gaps,
            "missing_parameters": cmp.missing,
            "deterministic": self.deterministic,
            "findings": [f.to_json() for f in self.findings],
        }

    def describe(self) -> str:
        """The table, then the verdict in words and, when not certified, why."""
        tol = self.comparison.tolerance
        lines = [
            f"verify: {self.split_cfg.verify.steps} steps in {tol.precision}, dropout off; the "
            f"reference is {split_name(self.reference.split)}{self.reference_note}; tolerance "
            f"{tol.loss:g} (loss, gradient norm), {tol.grad:g} (each parameter's gradient).",
            self.table(),
        ]
        if self.certified:
            lines.append("certified: this split trains the same model as one big batch.")
        else:
            name, gap = self.comparison.worst_param
            lines.append(
                f"NOT certified: the largest gap is {name} ({_gap(gap)} > {tol.grad:g})"
                if not self.comparison.grads_ok
                else "NOT certified: the loss or gradient norm differs from the reference"
            )
            lines += [f"  - {f.message}" for f in self.findings]
        return "\n".join(lines)


def _finite(data: Any) -> Any:
    """JSON has no infinity: a gap that cannot be measured (a missing step or parameter, a shape
    that differs) is written as null."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return data


def write_certificate(run_dir: Path, certificate: Certificate) -> Path:
    path = run_dir / CERTIFICATE_FILE
    text = json.dumps(_finite(certificate.to_json()), indent=2, allow_nan=False)
    replace_own(path, text + "\n")
    return path
