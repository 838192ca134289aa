"""The order pytest-xdist hands modules to its workers (`--dist loadscope --no-loadscope-reorder`
gives them out in collection order, a module to whichever worker is free).

Measured with a per-test CPU profile of the whole suite (docs/development.md, Tests): the SLURM
modules mostly wait (the queue, a requeue, a node brought down) while holding a token per core,
and at the end of the collection order they waited beside the multi-process modules, which take
every token, so neither could run while the other waited. Spread among the end-to-end modules,
whose tests take one or two tokens, their waits overlap work. The multi-process modules follow,
then the quick unit tests, which fill the last workers' gaps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

ORDER = ("e2e", "multiproc", "unit")
"""The suite's directories in order; SLURM's are spread through the first."""
SPREAD = "slurm"


def _directory(module: str) -> str:
    parts = module.replace("\\", "/").split("/")
    return parts[-2] if len(parts) > 1 else ""


def module_order(modules: Sequence[str]) -> list[str]:
    """The modules (paths, in collection order) in the order to run them."""
    by_dir: dict[str, list[str]] = {}
    for module in modules:
        by_dir.setdefault(_directory(module), []).append(module)
    first = by_dir.pop(ORDER[0], [])
    spread = by_dir.pop(SPREAD, [])
    ordered = _interleave(first, spread)
    for name in ORDER[1:]:
        ordered += by_dir.pop(name, [])
    return ordered + [m for rest in by_dir.values() for m in rest]


def _interleave(base: list[str], spread: list[str]) -> list[str]:
    """`spread` evenly among `base`, the first after base's first module (the heaviest start)."""
    if not base or not spread:
        return base + spread
    out: list[str] = []
    gap = len(base) / len(spread)
    placed = 0
    for i, module in enumerate(base):
        out.append(module)
        while placed < len(spread) and i + 1 >= placed * gap + 1:
            out.append(spread[placed])
            placed += 1
    return out + spread[placed:]


def reorder(items: list[T], module_of: Callable[[T], str]) -> list[T]:
    """Items grouped by module in module_order, each module's items in their own order."""
    modules = list(dict.fromkeys(map(module_of, items)))
    rank = {module: i for i, module in enumerate(module_order(modules))}
    return sorted(items, key=lambda item: rank[module_of(item)])
