"""The memory plan as `launch plan` and `launch train` print it: one row per part, the peak next to
the budget, and the automatic choice with its reason."""

from __future__ import annotations

from typing import Any

from launcher.memory.budget import size


def memory_table(
    memory_plan: dict[str, Any], budget: int | None, choice: dict[str, Any] | None
) -> list[str]:
    if not memory_plan:
        return []
    peak = memory_plan["planned_peak_bytes"]
    head = (
        f"memory plan per rank: micro-batch of {memory_plan['micro_size']}, "
        f"ac={memory_plan['ac']}, activations by {memory_plan['activations_method']}"
    )
    lines = [head]
    for name, n in memory_plan["parts"].items():
        share = f"{n / peak:6.1%}" if peak else ""
        lines.append(f"  {name:<18}{size(n):>14}  {share}")
    against = f"{peak / budget:.0%} of the budget {size(budget)}" if budget else "no budget"
    lines.append(f"  {'planned peak':<18}{size(peak):>14}  {against}")
    host = memory_plan.get("host_parts") or {}
    if host:
        held = ", ".join(f"{name} {size(n)}" for name, n in host.items())
        lines.append(f"  {'host (offloaded)':<18}{size(sum(host.values())):>14}  {held}")
    if choice is not None:
        lines.append(f"choice      {choice['reason']}")
    return lines


def beside_full(adapter: dict[str, Any], full: dict[str, Any] | None) -> list[str]:
    """The adapter run's parameters, gradients, optimizer state and peak beside a full
    fine-tune's (adapter=lora)."""
    if not full or not adapter:
        return []
    lines = ["adapter     per rank          lora      full fine-tune"]
    for part in ("parameters", "gradients", "optimizer_state"):
        ours, theirs = adapter["parts"][part], full["parts"][part]
        lines.append(f"  {part:<18} {mib(ours):>12} {mib(theirs):>14}")
    peak, full_peak = adapter["planned_peak_bytes"], full["planned_peak_bytes"]
    lines.append(f"  {'planned peak':<18} {mib(peak):>12} {mib(full_peak):>14}")
    return lines


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"
