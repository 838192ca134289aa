"""Start-up of `launch train parallel.dp=2 train.steps=1 wandb.mode=disabled` against a bare
torchrun job (benchmarks/startup_floor.py: DDP of an embedding and a linear layer, one AdamW step),
in pairs: one warm-up pair (page cache, the launcher's plan caches), then --pairs pairs, the order
inside a pair alternating, so that the machine's noise hits both. Issue 43's goal: the median of
the pairs' ratios (launch / floor wall time) at most 1.10.

Each process runs with LAUNCHER_TIMINGS=1: `launch` and every rank print `timing: <who> <phase>
<unix time>` on stderr (launcher/logs.py; the floor prints the same rank lines). The phases, medians
over the pairs, each the time between two marks (for the ranks: when the last rank got there):

    python     the command's start to `launch`'s main (the interpreter, cli.py's imports)
    compose    Hydra's composition of the config (and its run directory)
    imports    the modules the plan needs (torch)
    plan       validate, plan, write config.yaml and plan.json
    spawn      the first rank started (for the floor: torchrun's own start, torch included)
    worker import, init (process group), build (model, engine, data), first step,
    end        checkpoint, exact-match evaluation, summary
    exit       the ranks' exit; tail: the command's exit after its last rank's

    .venv/bin/python -m benchmarks.startup [--pairs 5] [--json startup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# wandb.mode=disabled: the floor tracks nothing either (the environment's WANDB_MODE below is
# wandb's own switch; the launcher's is its config key).
LAUNCH = [
    sys.executable,
    "-m",
    "launcher.cli",
    "train",
    "parallel.dp=2",
    "train.steps=1",
    "wandb.mode=disabled",
]
FLOOR = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc_per_node=2",
    str(ROOT / "benchmarks" / "startup_floor.py"),
]
MARK = re.compile(r"timing: (\S+) (\S+) (\d+\.\d{6})")
PHASES = (  # name, from, to: a mark of `launch`, of the ranks (`rank:`), or the command's t0/end
    ("python", "t0", "start"),
    ("compose", "start", "composed"),
    ("imports", "composed", "imported"),
    ("plan", "imported", "planned"),
    ("spawn", "planned", "rank:first"),
    ("worker import", "rank:started", "rank:imported"),
    ("init", "rank:imported", "rank:initialized"),
    ("build", "rank:initialized", "rank:built"),
    ("first step", "rank:built", "rank:trained"),
    ("end", "rank:trained", "rank:done"),
    ("exit", "rank:done", "rank:exit"),
    ("tail", "rank:exit", "end"),
)


def run_timed(argv: list[str]) -> dict[str, float]:
    """Run `argv`; its wall time, and its marks as seconds since its start (a rank mark: the
    last rank's; `rank:first`, the first rank's start)."""
    env = {
        **os.environ,
        "LAUNCHER_TIMINGS": "1",
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    t0 = time.time()
    proc = subprocess.run(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    end = time.time()
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        raise SystemExit(f"{' '.join(argv)} failed with exit status {proc.returncode}")
    marks: dict[str, float] = {"t0": 0.0, "end": end - t0}
    for who, phase, at in MARK.findall(proc.stdout):
        seconds = float(at) - t0
        if who == "launch":
            marks.setdefault(phase, seconds)
            continue
        key = f"rank:{phase}"
        marks[key] = max(marks.get(key, seconds), seconds)
        if phase == "started":
            marks["rank:first"] = min(marks.get("rank:first", seconds), seconds)
    return marks


def phases(marks: dict[str, float], floor: bool) -> dict[str, float]:
    """Each phase's seconds; the floor's spawn counts from its command's start (torchrun's own
    start, torch's import included), and it has none of `launch`'s phases before it."""
    out: dict[str, float] = {}
    for name, start, stop in PHASES:
        if floor and name == "spawn":
            start = "t0"
        if start in marks and stop in marks:
            out[name] = marks[stop] - marks[start]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    launch: list[dict[str, float]] = []
    floor: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs + 1):  # pair 0 warms the page cache and the plan's caches
            run_launch = lambda: run_timed([*LAUNCH, f"hydra.run.dir={Path(tmp) / f'run{pair}'}"])  # noqa: B023, E731
            if pair % 2:
                b = run_timed(FLOOR)
                a = run_launch()
            else:
                a = run_launch()
                b = run_timed(FLOOR)
            ratio = a["end"] / b["end"]
            label = "warm-up" if pair == 0 else f"pair {pair}"
            print(f"{label}: launch {a['end']:.2f}s, floor {b['end']:.2f}s, ratio {ratio:.3f}")
            if pair:
                launch.append(a)
                floor.append(b)

    ratios = [a["end"] / b["end"] for a, b in zip(launch, floor, strict=True)]
    result: dict[str, object] = {
        "pairs": args.pairs,
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "launch_wall_s": statistics.median(a["end"] for a in launch),
        "floor_wall_s": statistics.median(b["end"] for b in floor),
    }
    launch_phases = [phases(m, floor=False) for m in launch]
    floor_phases = [phases(m, floor=True) for m in floor]
    table: dict[str, dict[str, float | None]] = {}
    for name, _, _ in PHASES:
        row: dict[str, float | None] = {}
        for side, rows in (("launch", launch_phases), ("floor", floor_phases)):
            values = [r[name] for r in rows if name in r]
            row[side] = statistics.median(values) if values else None
        table[name] = row
    result["phases_s"] = table
    print(f"median ratio {result['ratio_median']:.3f} over {args.pairs} pairs")
    print(f"wall time: launch {result['launch_wall_s']:.2f}s, floor {result['floor_wall_s']:.2f}s")
    print(f"{'phase':14s} {'launch':>8s} {'floor':>8s}")
    for name, row in table.items():
        cells = [f"{row[side]:8.3f}" if row[side] is not None else f"{'-':>8s}" for side in row]
        print(f"{name:14s} {' '.join(cells)}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
