"""Which source each sample of a mixture comes from: a schedule computed from the position, not
stored, the same for every split.

The sources are the leaves of a balanced binary tree. Each inner node splits the positions that
reach it between its two subtrees in proportion a : b of their weights, by Bresenham's rule: of
its first i positions, L(i) = floor((i * a + h) / (a + b)) go left (h = (a + b) // 2 centres the
rounding), so position i goes left exactly when L(i + 1) > L(i), and is the L(i)-th position of
the left subtree, else the (i - L(i))-th of the right. L grows by 0 or 1 per position, so every
source's count of the first T positions is within (tree depth) of T * weight, at every T: each
global batch holds every source in proportion (within a sample or two) and no long run of one
source ever builds up. Routing a position costs one integer division per level, vectorised over
a batch; a source's own index then walks its own order (its epochs are its own).

The weights are quantised to integers out of 2^20 (each at least 1), exact in integer arithmetic
at any position (i is split as q * (a + b) + r, so nothing overflows 64 bits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESOLUTION = 1 << 20


def quantise(weights: Sequence[float]) -> list[int]:
    total = float(sum(weights))
    return [max(1, round(w / total * RESOLUTION)) for w in weights]


@dataclass(frozen=True)
class _Node:
    left: _Node | int  # a subtree, or a source's number
    right: _Node | int
    a: int  # the left subtree's weight
    b: int

    def lefts(self, i: np.ndarray) -> np.ndarray:
        """L(i): how many of this node's first i positions went left."""
        total = self.a + self.b
        q, r = np.divmod(i, total)
        return q * self.a + (r * self.a + total // 2) // total


def _build(sources: list[int], weights: list[int]) -> tuple[_Node | int, int]:
    if len(sources) == 1:
        return sources[0], weights[sources[0]]
    half = len(sources) // 2
    left, a = _build(sources[:half], weights)
    right, b = _build(sources[half:], weights)
    return _Node(left, right, a, b), a + b


class MixtureSchedule:
    """Position p of the endless sample order -> (source, the source's own position)."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.quanta = quantise(weights)
        self.root, _ = _build(list(range(len(self.quanta))), self.quanta)

    def route(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source of each position, its position within that source's own order)."""
        positions = np.asarray(positions, dtype=np.int64)
        source = np.zeros_like(positions)
        index = positions.copy()
        self._route(self.root, np.arange(len(positions)), index, source)
        return source, index

    def _route(self, node: _Node | int, where: np.ndarray, index: np.ndarray, source: np.ndarray):
        if isinstance(node, int):
            source[where] = node
            return
        i = index[where]
        before, after = node.lefts(i), node.lefts(i + 1)
        left = after > before
        index[where] = np.where(left, before, i - before)
        self._route(node.left, where[left], index, source)
        self._route(node.right, where[~left], index, source)

    def counts(self, total: int) -> list[int]:
        """How many of the first `total` positions each source takes."""
        out = [0] * len(self.quanta)
        self._count(self.root, total, out)
        return out

    def _count(self, node: _Node | int, total: int, out: list[int]) -> None:
        if isinstance(node, int):
            out[node] = total
            return
        left = int(node.lefts(np.array([total], dtype=np.int64))[0])
        self._count(node.left, left, out)
        self._count(node.right, total - left, out)
