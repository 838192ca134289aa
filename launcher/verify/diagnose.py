"""Why a split was not certified, as far as the evidence tells: each finding names its cause and
the numbers that show it, the most likely first.

The evidence: the comparison of the split with the reference, the reference run a second time
(a model that disagrees with itself is not deterministic, whatever the split), the running
statistics of batch-dependent layers, and the model probes of launcher/verify/probe.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from launcher.config.root import RootConfig
from launcher.verify.compare import Comparison
from launcher.verify.probe import ModelEvidence

SAMPLE_DEPENDENCE = 1e-4
"""A sample's outputs alone and inside a larger batch differ by more: the model mixes samples
(fp32 kernels of other batch shapes move the 7th digit only)."""


@dataclass(frozen=True)
class Finding:
    cause: str
    """deterministic | normalization | batch_dependent | random_draws | own_loss | unknown"""
    message: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def _worst(comparison: Comparison) -> str:
    name, gap = comparison.worst_param
    return f"{name} (gap {gap:.2e})" if name is not None else "none"


def _nondeterminism(repeat: Comparison) -> Finding:
    loss = max(repeat.loss_gaps, default=0.0)
    return Finding(
        "deterministic",
        "the model is not deterministic: the reference, run twice on the same inputs, disagrees "
        f"with itself (loss gap {loss:.2e}, worst parameter {_worst(repeat)}), so no split can "
        "match it and the split is not to blame. Find the op: torch.use_deterministic_algorithms"
        "(True) names ops without a deterministic kernel; random numbers from an unseeded "
        "generator do the same.",
    )


def _batch_dependent(
    split: RootConfig, evidence: ModelEvidence, stats_gaps: dict[str, float]
) -> Finding | None:
    shape = split.split()
    if not evidence.batch_dependent or shape.micro_size >= shape.global_size:
        return None
    layers = ", ".join(f"{t} ({n})" for n, t in sorted(evidence.batch_dependent.items()))
    moved = {n: g for n, g in stats_gaps.items() if g > 0.0}
    stats = (
        "; their running statistics differ from the reference's by up to "
        f"{max(moved.values()):.2e} ({max(moved, key=lambda n: moved[n])})"
        if moved
        else ""
    )
    if evidence.sample_dependence > SAMPLE_DEPENDENCE:
        stats += (
            "; a micro-batch's outputs alone and inside the global batch differ by "
            f"{evidence.sample_dependence:.2e}"
        )
    return Finding(
        "batch_dependent",
        f"batch-dependent layers: {layers} normalise over each micro-batch of "
        f"{shape.micro_size} sequences, not the global batch of {shape.global_size}{stats}. "
        "Replace them with LayerNorm or GroupNorm (or SyncBatchNorm with grad_accum=1).",
    )


def _normalization(split: RootConfig, comparison: Comparison, ev: ModelEvidence) -> Finding | None:
    counts = [c for rank in ev.micro_valid for c in rank]
    uneven = len(set(counts)) > 1
    first_loss_ok = bool(comparison.loss_gaps) and comparison.loss_gaps[0] <= (
        comparison.tolerance.loss
    )
    if split.debug.broken_normalization:
        return Finding(
            "normalization",
            "debug.broken_normalization=true: each micro-batch's loss is its own token mean "
            "divided by grad_accum (the negative control), not its share of the global token "
            f"mean; with micro-batches of {min(counts)}..{max(counts)} valid tokens the gradient "
            f"is wrong, worst at {_worst(comparison)}.",
        )
    if not (first_loss_ok and not comparison.grads_ok and uneven):
        return None
    return Finding(
        "normalization",
        "step 1's loss matches the reference but its gradient does not: what is "
        "backpropagated is normalised differently from the global token mean. The micro-batches "
        f"hold {min(counts)}..{max(counts)} valid target tokens of {ev.positions_per_micro} "
        "positions (padding and masked targets): a loss divided per micro-batch, or a "
        "denominator that counts padding, gives exactly this.",
    )


def diagnose(
    split: RootConfig,
    comparison: Comparison,
    repeat: Comparison | None,
    evidence: ModelEvidence | None,
    stats_gaps: dict[str, float],
) -> list[Finding]:
    """The findings for a split that was not certified (empty when it was)."""
    if comparison.certified:
        return []
    findings: list[Finding] = []
    if repeat is not None and not repeat.certified:
        findings.append(_nondeterminism(repeat))
    if evidence is not None:
        for found in (
            _normalization(split, comparison, evidence),
            _batch_dependent(split, evidence, stats_gaps),
        ):
            if found is not None:
                findings.append(found)
        if evidence.sample_dependence > SAMPLE_DEPENDENCE and not evidence.batch_dependent:
            findings.append(
                Finding(
                    "batch_dependent",
                    "a sample's output depends on the other samples of its batch (the first "
                    "micro-batch alone and inside the global batch differ by "
                    f"{evidence.sample_dependence:.2e}): the model computes across the batch "
                    "dimension, so the split changes what it computes.",
                )
            )
        if evidence.draws_random:
            recompute = (
                f" and ac={split.ac.policy.value} recomputes the forward: a recompute that "
                "does not restore the random state redraws them"
                if split.ac.policy.value != "none"
                else ""
            )
            findings.append(
                Finding(
                    "random_draws",
                    "the model draws random numbers in its forward with dropout off: the draws "
                    f"differ between the split and the reference (per-rank seeds, micro-batch "
                    f"order){recompute}. Make them depend on the sample, or switch them off.",
                )
            )
        if evidence.own_loss:
            findings.append(
                Finding(
                    "own_loss",
                    "the model returns a loss of its own (usually a per-micro-batch mean); launch "
                    "ignores it and differentiates the token-exact loss of its logits, so it is "
                    "not the cause here; a training script that uses it would be wrong.",
                )
            )
    if not findings:
        findings.append(
            Finding(
                "unknown",
                f"no cause found; the largest gradient gap is at {_worst(comparison)}, loss gaps "
                + ", ".join(f"{g:.2e}" for g in comparison.loss_gaps)
                + ".",
            )
        )
    return findings
