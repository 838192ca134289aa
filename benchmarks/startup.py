"""Start-up of `launch train parallel.dp=2 train.steps=1 wandb.mode=disabled` against a bare
torchrun job (benchmarks/startup_floor.py: DDP of an embedding and a linear layer, one AdamW step),
in pairs: one warm-up pair (page cache, the launcher's plan caches), then --pairs pairs, the order
inside a pair alternating, so that the machine's noise hits both. Issue 43's goal: the median of
the pairs' ratios (launch / floor wall time) at most 1.10. Also reported: the ratio of CPU time
(the command and every process it waited for), which a busy machine disturbs less.

Each process runs with LAUNCHER_TIMINGS=1: `launch` and every rank print `timing: <who> <phase>
<unix time> <CPU seconds>` on stderr (launcher/logs.py; the floor prints the same rank lines).
The phases, medians over the pairs, each the wall time between two marks (for the ranks: when the
last rank got there) and the CPU time the process spent in it (for the ranks: their mean):

    python       the command's start to `launch`'s main (the interpreter, cli.py's imports)
    compose      Hydra's composition of the config (and its run directory)
    imports      the modules the plan needs (torch)
    plan         validate, plan, write config.yaml and plan.json
    spawn        to the first rank's start (for the floor: torchrun's own start, torch included)
    worker import, init (the process group), build (model, engine, data), first step
    end          the final checkpoint, the exact-match evaluation, the summary
    exit         the ranks' exit; tail: the command's exit after its last rank's

    .venv/bin/python -m benchmarks.startup [--pairs 5] [--json startup.json] [--with-exec]

--with-exec also runs `launch` with its ranks exec'd as torchrun does (LAUNCHER_RANK_START=exec)
after each pair, to show what forking them from `launch` saves (launcher/runners/rank_fork.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
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
MARK = re.compile(r"timing: (\S+) (\S+) (\d+\.\d{6}) (\d+\.\d{6})")
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


class Run:
    """One command's wall time, CPU time and marks."""

    def __init__(self, argv: list[str], extra_env: dict[str, str] | None = None) -> None:
        env = {
            **os.environ,
            "LAUNCHER_TIMINGS": "1",
            "WANDB_MODE": "disabled",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        proc = subprocess.run(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.wall = time.time() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            sys.stdout.write(proc.stdout)
            raise SystemExit(f"{' '.join(argv)} failed with exit status {proc.returncode}")
        # who -> phase -> (seconds since t0, the process's CPU seconds)
        self.marks: dict[str, dict[str, tuple[float, float]]] = {}
        for who, phase, at, cpu in MARK.findall(proc.stdout):
            self.marks.setdefault(who, {}).setdefault(phase, (float(at) - t0, float(cpu)))

    def at(self, point: str) -> float | None:
        """Seconds since the start: t0, end, a mark of `launch`, or `rank:<mark>` (the last
        rank's; `rank:first`, the first rank's start)."""
        if point == "t0":
            return 0.0
        if point == "end":
            return self.wall
        if not point.startswith("rank:"):
            found = self.marks.get("launch", {}).get(point)
            return found[0] if found else None
        phase = point.removeprefix("rank:")
        ranks = [m for who, m in self.marks.items() if who != "launch"]
        if phase == "first":
            times = [m["started"][0] for m in ranks if "started" in m]
            return min(times) if times else None
        times = [m[phase][0] for m in ranks if phase in m]
        return max(times) if len(times) == len(ranks) and times else None

    def cpu_in(self, start: str, stop: str) -> float | None:
        """CPU seconds one process spent between two of its own marks (ranks: their mean)."""
        if start.startswith("rank:") and stop.startswith("rank:"):
            a, b = start.removeprefix("rank:"), stop.removeprefix("rank:")
            spent = [
                m[b][1] - m[a][1]
                for w, m in self.marks.items()
                if w != "launch" and a in m and b in m
            ]
            return statistics.mean(spent) if spent else None
        own = self.marks.get("launch", {})
        if start in own and stop in own:
            return own[stop][1] - own[start][1]
        return None

    def phases(self, floor: bool) -> dict[str, tuple[float, float | None]]:
        """Each phase's (wall seconds, CPU seconds); the floor's spawn counts from its command's
        start (torchrun's own start, torch's import included), and it has none of `launch`'s
        phases before it."""
        out: dict[str, tuple[float, float | None]] = {}
        for name, start, stop in PHASES:
            if floor and name == "spawn":
                start = "t0"
            a, b = self.at(start), self.at(stop)
            if a is not None and b is not None:
                out[name] = (b - a, self.cpu_in(start, stop))
        return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", "--rounds", dest="pairs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--with-exec",
        action="store_true",
        help="each pair also runs `launch` with LAUNCHER_RANK_START=exec (ranks exec'd as "
        "torchrun does, not forked from `launch`: launcher/runners/rank_fork.py)",
    )
    args = parser.parse_args()
    launch: list[Run] = []
    floor: list[Run] = []
    exec_ranks: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs + 1):  # pair 0 warms the page cache and the plan's caches
            launch_argv = [*LAUNCH, f"hydra.run.dir={Path(tmp) / f'run{pair}'}"]
            exec_argv = [*LAUNCH, f"hydra.run.dir={Path(tmp) / f'exec{pair}'}"]
            if pair % 2:
                b = Run(FLOOR)
                a = Run(launch_argv)
            else:
                a = Run(launch_argv)
                b = Run(FLOOR)
            e = Run(exec_argv, {"LAUNCHER_RANK_START": "exec"}) if args.with_exec else None
            label = "warm-up" if pair == 0 else f"pair {pair}"
            print(
                f"{label}: launch {a.wall:.2f}s ({a.cpu:.2f}s CPU), floor {b.wall:.2f}s "
                f"({b.cpu:.2f}s CPU), ratio {a.wall / b.wall:.3f}"
                + (f"; exec'd ranks {e.wall:.2f}s ({e.cpu:.2f}s CPU)" if e else ""),
                flush=True,
            )
            if pair:
                launch.append(a)
                floor.append(b)
                if e is not None:
                    exec_ranks.append(e)

    ratios = [a.wall / b.wall for a, b in zip(launch, floor, strict=True)]
    cpu_ratios = [a.cpu / b.cpu for a, b in zip(launch, floor, strict=True)]
    table: dict[str, dict[str, float | None]] = {}
    for side, runs, is_floor in (("launch", launch, False), ("floor", floor, True)):
        per_run = [run.phases(is_floor) for run in runs]
        for name, _, _ in PHASES:
            walls = [p[name][0] for p in per_run if name in p]
            cpus = [c for p in per_run if name in p and (c := p[name][1]) is not None]
            row = table.setdefault(name, {})
            row[f"{side}_wall_s"], row[f"{side}_cpu_s"] = _median(walls), _median(cpus)
    result = {
        "pairs": args.pairs,
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "launch_wall_s": statistics.median(a.wall for a in launch),
        "floor_wall_s": statistics.median(b.wall for b in floor),
        "launch_cpu_s": statistics.median(a.cpu for a in launch),
        "floor_cpu_s": statistics.median(b.cpu for b in floor),
        "phases": table,
    }
    if exec_ranks:
        result["exec_wall_s"] = statistics.median(e.wall for e in exec_ranks)
        result["exec_cpu_s"] = statistics.median(e.cpu for e in exec_ranks)
        result["exec_ratio_median"] = statistics.median(
            e.wall / b.wall for e, b in zip(exec_ranks, floor, strict=True)
        )
    print(
        f"median ratio {result['ratio_median']:.3f} over {args.pairs} pairs "
        f"({', '.join(f'{r:.3f}' for r in ratios)}); CPU time ratio "
        f"{result['cpu_ratio_median']:.3f}"
    )
    print(
        f"wall: launch {result['launch_wall_s']:.2f}s, floor {result['floor_wall_s']:.2f}s; "
        f"CPU: launch {result['launch_cpu_s']:.2f}s, floor {result['floor_cpu_s']:.2f}s"
    )
    if exec_ranks:
        print(
            f"exec'd ranks: wall {result['exec_wall_s']:.2f}s, CPU {result['exec_cpu_s']:.2f}s, "
            f"median ratio to the floor {result['exec_ratio_median']:.3f}"
        )
    columns = ("launch_wall_s", "floor_wall_s", "launch_cpu_s", "floor_cpu_s")
    print(f"{'phase':14s} {'launch':>8s} {'floor':>8s} {'CPU launch':>11s} {'CPU floor':>10s}")
    for name, row in table.items():
        cells = [f"{row[c]:.3f}" if row[c] is not None else "-" for c in columns]
        print(f"{name:14s} {cells[0]:>8s} {cells[1]:>8s} {cells[2]:>11s} {cells[3]:>10s}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
