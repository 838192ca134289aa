"""Start-up and tail of `launch train parallel.dp=2 train.steps=1` against a bare torchrun job doing
the same step (benchmarks/startup_floor.py), alternated round by round so machine noise hits both.

Reports the median wall time of each, their ratio (goal: at most 1.3), and where the launcher's
extra time goes: before torchrun starts (from the `run directory:` line it prints just before
starting torchrun's agent, which runs inside `launch`) and after the last rank said `done` (the
tail).

    .venv/bin/python -m benchmarks.startup [--rounds 5] [--json startup.json]
"""

from __future__ import annotations

import argparse
import json
import os
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


def _timed(argv: list[str], marks: dict[str, str]) -> dict[str, float]:
    """Wall time of `argv`, and the time each marker text first appeared in its output."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    seen: dict[str, float] = {}
    for line in proc.stdout:
        for name, text in marks.items():
            if name not in seen and text in line:
                seen[name] = time.perf_counter() - start
    if proc.wait() != 0:
        raise SystemExit(f"{' '.join(argv)} failed with exit status {proc.returncode}")
    return {"wall_s": time.perf_counter() - start, **seen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    launch, floor = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds + 1):  # round 0 warms the page cache; not counted
            run_dir = Path(tmp) / f"run{r}"
            a = _timed(
                [*LAUNCH, f"hydra.run.dir={run_dir}"],
                {"torchrun_start_s": "run directory:", "done_s": "done:"},
            )
            b = _timed(FLOOR, {"done_s": "floor: one step"})
            if r:
                launch.append(a)
                floor.append(b)

    def median(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    result = {
        "rounds": args.rounds,
        "launch_wall_s": median(launch, "wall_s"),
        "floor_wall_s": median(floor, "wall_s"),
        "launch_before_torchrun_s": median(launch, "torchrun_start_s"),
        "launch_tail_s": statistics.median(row["wall_s"] - row["done_s"] for row in launch),
        "floor_tail_s": statistics.median(row["wall_s"] - row["done_s"] for row in floor),
    }
    result["ratio"] = result["launch_wall_s"] / result["floor_wall_s"]
    for key, value in result.items():
        print(f"{key:26s} {value:.3f}" if isinstance(value, float) else f"{key:26s} {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
