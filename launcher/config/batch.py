"""Batch arithmetic, in one place: global = dp x grad_accum x micro_size sequences."""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.errors import ConfigError

MAX_GLOBAL_SIZE = 2**40
"""Larger global batches are refused as typos (and keep divisors() within a million steps)."""

GLOBAL, MICRO, ACCUM, DP = (
    "batch.global_size",
    "batch.micro_size",
    "batch.grad_accum",
    "parallel.dp",
)


@dataclass(frozen=True)
class BatchSplit:
    """How one optimizer step's global batch is cut into per-rank micro-batches."""

    global_size: int
    micro_size: int
    grad_accum: int
    dp: int

    @property
    def per_rank(self) -> int:
        return self.micro_size * self.grad_accum


def divisors(n: int) -> list[int]:
    """The divisors of n, smallest first, in O(sqrt n) (batch.global_size is at most 2**40)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _show(values: list[int], limit: int = 8) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (", ..." if len(values) > limit else "")


def _nearby_multiples(n: int, unit: int) -> list[int]:
    low = (n // unit) * unit
    return [m for m in (low, low + unit) if m > 0]


def smaller_global(
    limit: int, micro_size: int | None, grad_accum: int | None, dp: int
) -> tuple[str, str] | None:
    """The override that sets the largest global batch of at most `limit` sequences that still
    splits as set (a multiple of dp x micro_size when micro_size is set, else of dp x grad_accum),
    and what it is a multiple of, in words; None when no such batch exists (limit < the unit)."""
    if micro_size is not None:
        unit, what = dp * micro_size, f"dp {dp} x micro_size {micro_size}"
    else:
        unit, what = dp * (grad_accum or 1), f"dp {dp} x grad_accum {grad_accum or 1}"
    size = (limit // unit) * unit
    if size <= 0:
        return None
    both = micro_size is not None and grad_accum is not None  # grad_accum then derived again
    return f"{GLOBAL}={size}" + (f" {ACCUM}=null" if both else ""), f"a multiple of {what}"


def resolve_batch(
    global_size: int | None, micro_size: int | None, grad_accum: int | None, dp: int
) -> BatchSplit:
    """Derive the missing one of global_size, micro_size, grad_accum (given dp) and check the rest.

    Any two determine the third; global_size alone implies grad_accum=1; micro_size alone implies
    grad_accum=1. Every error names the keys and suggests values that divide.
    """
    if dp <= 0:
        raise ConfigError(DP, f"must be positive, got {dp}.")
    if global_size is None and micro_size is None:
        raise ConfigError(
            [GLOBAL, MICRO],
            "at least one of them must be set.",
            f"set {GLOBAL}=<sequences per step> (and optionally {MICRO} or {ACCUM}).",
        )
    if global_size is None:
        assert micro_size is not None
        accum = grad_accum or 1
        return BatchSplit(micro_size * accum * dp, micro_size, accum, dp)
    if global_size > MAX_GLOBAL_SIZE:
        # A typo, and one whose divisors (the suggestions, batch.micro_size=auto) take long.
        raise ConfigError(
            GLOBAL,
            f"{global_size:,} sequences per step is more than any run holds "
            f"(at most 2**40 = {MAX_GLOBAL_SIZE:,}).",
            f"check {GLOBAL} for a typo.",
        )

    if global_size % dp:
        raise ConfigError(
            [GLOBAL, DP],
            f"global_size={global_size} sequences do not split evenly over dp={dp} ranks.",
            f"use {GLOBAL} in {{{_show(_nearby_multiples(global_size, dp))}}} or {DP} in "
            f"{{{_show(divisors(global_size))}}}.",
        )
    per_rank = global_size // dp

    if micro_size is not None and grad_accum is not None:
        if micro_size * grad_accum * dp != global_size:
            raise ConfigError(
                [GLOBAL, MICRO, ACCUM, DP],
                f"{micro_size} x {grad_accum} x dp {dp} = {micro_size * grad_accum * dp}, not "
                f"{global_size}.",
                f"set one of them to null so it is derived (e.g. {ACCUM}=null), or make dp x "
                "grad_accum x micro_size equal global_size.",
            )
        return BatchSplit(global_size, micro_size, grad_accum, dp)

    if micro_size is not None:
        if per_rank % micro_size:
            raise ConfigError(
                [GLOBAL, MICRO] + ([DP] if dp > 1 else []),
                f"global_size={global_size} is not a multiple of micro_size={micro_size} x "
                f"dp={dp}.",
                f"use {MICRO} in {{{_show(divisors(per_rank))}}} or {GLOBAL} in "
                f"{{{_show(_nearby_multiples(global_size, micro_size * dp))}}}.",
            )
        return BatchSplit(global_size, micro_size, per_rank // micro_size, dp)

    accum = grad_accum if grad_accum is not None else 1
    if per_rank % accum:
        raise ConfigError(
            [GLOBAL, ACCUM] + ([DP] if dp > 1 else []),
            f"global_size={global_size} is not a multiple of grad_accum={accum} x dp={dp}.",
            f"use {ACCUM} in {{{_show(divisors(per_rank))}}} or {GLOBAL} in "
            f"{{{_show(_nearby_multiples(global_size, accum * dp))}}}.",
        )
    return BatchSplit(global_size, per_rank // accum, accum, dp)
