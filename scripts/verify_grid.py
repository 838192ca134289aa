"""`launch verify` over a pairwise grid of dp 1-4 x grad_accum 1-8 x engine (ddp, fsdp, ZeRO 0-3)
x recompute granularity (none, full, every_n, sqrt, selective): every pair of values of any two
axes appears in at least one row (a covering array, built greedily below), each row one real
`launch verify` (torchrun ranks for dp > 1), on the built-in GPT.

    .venv/bin/python scripts/verify_grid.py [--out DIR] [--markdown FILE] [--jobs-from N]

Each row's global batch is dp x grad_accum x 2 sequences (micro-batches of 2), so every value
of every axis fits; its reference is one process over that global batch. Prints a Markdown
table (docs/verify.md holds the last one) and exits 1 when any row is not certified.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DP = [1, 2, 3, 4]
ACCUM = [1, 2, 3, 4, 5, 6, 7, 8]
ENGINES = ["ddp", "fsdp", "zero0", "zero1", "zero2", "zero3"]
POLICIES = ["none", "full", "every_n", "sqrt", "selective"]
AXES = [DP, ACCUM, ENGINES, POLICIES]
MICRO = 2
MODEL = ["model.n_layer=4", "model.d_model=32", "model.n_head=2", "model.seq_len=24"]


def _pairs(row: tuple[object, ...]) -> set[tuple[int, object, int, object]]:
    return {(i, row[i], j, row[j]) for i, j in itertools.combinations(range(len(row)), 2)}


def pairwise_rows() -> list[tuple[int, int, str, str]]:
    """Greedy covering array: each new row covers the most pairs not covered yet (ties: the
    first in product order), until every pair of values of two axes is covered."""
    needed = {
        (i, a, j, b)
        for i, j in itertools.combinations(range(len(AXES)), 2)
        for a in AXES[i]
        for b in AXES[j]
    }
    candidates = list(itertools.product(*AXES))
    rows: list[tuple[int, int, str, str]] = []
    while needed:
        best = max(candidates, key=lambda row: len(_pairs(row) & needed))
        rows.append(best)  # type: ignore[arg-type]
        needed -= _pairs(best)
    return rows


@dataclass
class Row:
    dp: int
    accum: int
    engine: str
    policy: str
    certified: bool | None = None
    loss_gap: float | None = None
    worst: str = ""
    worst_gap: float | None = None
    seconds: float = 0.0
    note: str = ""

    def overrides(self) -> list[str]:
        engine = (
            ["engine=deepspeed", f"engine.zero_stage={self.engine[-1]}"]
            if self.engine.startswith("zero")
            else [f"engine={self.engine}"]
        )
        return [
            *MODEL,
            f"parallel.dp={self.dp}",
            f"batch.global_size={self.dp * self.accum * MICRO}",
            f"batch.grad_accum={self.accum}",
            *engine,
            f"ac={self.policy}",
            "wandb.mode=disabled",
            "train.device=cpu",
        ]


def run_row(row: Row, run_dir: Path) -> None:
    start = time.perf_counter()
    argv = [sys.executable, "-m", "launcher.cli", "verify", *row.overrides()]
    proc = subprocess.run(
        [*argv, f"hydra.run.dir={run_dir}"], cwd=REPO, capture_output=True, text=True
    )
    row.seconds = time.perf_counter() - start
    path = run_dir / "verify.json"
    if not path.is_file():
        row.note = (proc.stderr.strip().splitlines() or ["no output"])[-1][:120]
        return
    data = json.loads(path.read_text())
    row.certified = bool(data["certified"]) and proc.returncode == 0
    gaps = [s["loss_gap"] for s in data["steps"] if s["loss_gap"] is not None]
    row.loss_gap = max(gaps, default=None)
    row.worst = data["worst_parameter"]["name"] or ""
    row.worst_gap = data["worst_parameter"]["gap"]


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def markdown(rows: list[Row]) -> str:
    lines = [
        "| # | dp | grad_accum | micro | global | engine | ac | max loss gap | worst parameter "
        "| its gap | verdict | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, r in enumerate(rows, 1):
        verdict = {True: "certified", False: "**NOT certified**", None: f"error: {r.note}"}
        lines.append(
            f"| {n} | {r.dp} | {r.accum} | {MICRO} | {r.dp * r.accum * MICRO} | {r.engine} "
            f"| {r.policy} | {_num(r.loss_gap)} | {r.worst} | {_num(r.worst_gap)} "
            f"| {verdict[r.certified]} | {r.seconds:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="run directories (default: temp)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    rows = [Row(*r) for r in pairwise_rows()]
    out = args.out or Path(tempfile.mkdtemp(prefix="verify_grid_"))
    print(f"{len(rows)} rows cover every pair of values of dp x grad_accum x engine x ac")
    for n, row in enumerate(rows, 1):
        run_row(row, out / f"{n:02d}")
        verdict = {True: "certified", False: "NOT certified", None: "error"}[row.certified]
        shape = f"dp={row.dp} grad_accum={row.accum} engine={row.engine} ac={row.policy}"
        print(f"{n:2d}/{len(rows)} {shape}: {verdict} ({row.seconds:.0f}s)")
    table = markdown(rows)
    print(table)
    if args.markdown is not None:
        args.markdown.write_text(table + "\n", encoding="utf-8")
    return 0 if all(r.certified for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
