"""Which blocks each pipeline stage holds and which pipeline rank runs it: the stage layout that
the split (launcher/parallel/pipeline_split.py), the schedule, the memory plan and `launch plan`
all read, from parallel.pp, parallel.pp_schedule, parallel.pp_stages_per_rank and
parallel.pp_split. Checked in launcher/config/pipeline.py; pure arithmetic here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.config.root import RootConfig

INTERLEAVED = "interleaved_1f1b"
INTERLEAVED_DEFAULT = 2
"""Virtual stages per rank of the interleaved schedule when parallel.pp_stages_per_rank is null."""


def stages_per_rank(schedule: str, asked: int | None = None) -> int:
    """parallel.pp_stages_per_rank, or its default: 2 for the interleaved schedule, else 1."""
    if asked is not None:
        return asked
    return INTERLEAVED_DEFAULT if schedule == INTERLEAVED else 1


def even_starts(n_blocks: int, n_stages: int) -> list[int]:
    """Where stages 1.. start when every block costs the same: runs as equal as they can be (the
    later stages one block longer when n_blocks is not a multiple of n_stages)."""
    per, extra = divmod(n_blocks, n_stages)
    sizes = [per + (1 if s >= n_stages - extra else 0) for s in range(n_stages)]
    return [sum(sizes[:s]) for s in range(1, n_stages)]


def balanced_starts(block_costs: Sequence[int], first: int, last: int, n_stages: int) -> list[int]:
    """Where stages 1.. start so that the costliest stage costs least: each stage the sum of its
    blocks' costs, the first plus `first` (the embedding), the last plus `last` (the final norm
    and the head), every stage at least one block. Among splits of the same peak, the one whose
    stages are closest (least sum of squared costs). An exact dynamic programme over
    (stages, blocks): n_stages x n_blocks^2 steps."""
    n = len(block_costs)
    prefix = [0]
    for cost in block_costs:
        prefix.append(prefix[-1] + cost)
    inf = (float("inf"), float("inf"))
    # best[s][i]: the first i blocks in s stages -> ((peak, sum of squares), start of stage s-1)
    best: list[list[tuple[tuple[float, float], int]]] = [
        [(inf, 0)] * (n + 1) for _ in range(n_stages + 1)
    ]
    best[0][0] = ((0, 0), 0)
    for s in range(1, n_stages + 1):
        for i in range(s, n - (n_stages - s) + 1):
            for j in range(s - 1, i):
                (peak, squares), _ = best[s - 1][j]
                if peak == float("inf"):
                    continue
                cost = prefix[i] - prefix[j] + (first if s == 1 else 0)
                cost += last if s == n_stages else 0
                candidate = (max(peak, cost), squares + cost * cost)
                if candidate < best[s][i][0]:
                    best[s][i] = (candidate, j)
    starts, i = [], n
    for s in range(n_stages, 1, -1):
        i = best[s][i][1]
        starts.append(i)
    return sorted(starts)


@dataclass(frozen=True)
class StageLayout:
    """The pipeline's stages: pp ranks x per_rank virtual stages, stage s on rank s % pp (loop
    placement, torch's for the one- and the interleaved schedules), its blocks from starts[s] to
    starts[s + 1]."""

    pp: int
    schedule: str
    per_rank: int
    n_blocks: int
    starts: tuple[int, ...]
    """Where stages 1.. start (parallel.pp_split, or the even default)."""

    @property
    def n_stages(self) -> int:
        return self.pp * self.per_rank

    def ranges(self) -> list[range]:
        bounds = [0, *self.starts, self.n_blocks]
        return [range(bounds[s], bounds[s + 1]) for s in range(self.n_stages)]

    def rank_of(self, stage: int) -> int:
        return stage % self.pp

    def stages_of(self, pp_rank: int) -> list[int]:
        return [s for s in range(self.n_stages) if self.rank_of(s) == pp_rank]

    def describe(self) -> list[dict[str, object]]:
        """plan.json's `pipeline.stages`: per stage its pp rank and blocks."""
        last = self.n_stages - 1
        return [
            {
                "stage": s,
                "pp_rank": self.rank_of(s),
                "blocks": list(blocks),
                "embedding": s == 0,
                "head": s == last,
            }
            for s, blocks in enumerate(self.ranges())
        ]


def stage_layout(cfg: RootConfig, starts: Sequence[int] | None = None) -> StageLayout:
    """The layout of a checked config: parallel.pp_split where given (or `starts`), else the
    even split (the plan resolves the balanced one into parallel.pp_split before the ranks
    start: launcher/memory/stages.py)."""
    parallel = cfg.parallel
    per_rank = stages_per_rank(parallel.pp_schedule, parallel.pp_stages_per_rank)
    n_blocks = int(getattr(cfg.model, "n_layer", 0))  # the config allows the built-in GPT only
    n_stages = parallel.pp * per_rank
    chosen = starts if starts is not None else parallel.pp_split
    if chosen is None or parallel.pp == 1:
        chosen = even_starts(n_blocks, n_stages) if n_blocks >= n_stages else []
    return StageLayout(parallel.pp, parallel.pp_schedule, per_rank, n_blocks, tuple(chosen))
