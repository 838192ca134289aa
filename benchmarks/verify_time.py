"""The time of `launch verify parallel.dp=2` for the default model (model=tiny, the built-in task,
global batch 32, verify.steps=3): the configured split through torchrun, the one-big-batch
reference in-process, the comparison. Goal: under a minute on a 2-core CPU.

Reports the median wall time over the rounds and where it goes, from the lines `launch verify`
prints: planning (until the split starts), the split (torchrun, 2 ranks), the reference and the
certificate.

    .venv/bin/python -m benchmarks.verify_time [--rounds 3] [--json verify_time.json]
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
LAUNCH = [sys.executable, "-m", "launcher.cli", "verify", "parallel.dp=2", "wandb.mode=disabled"]
MARKS = {"split": "verify: the configured split", "reference": "verify: the reference,"}


def one_round(run_dir: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*LAUNCH, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen: dict[str, float] = {}
    for line in proc.stdout:
        for name, text in MARKS.items():
            if name not in seen and text in line:
                seen[name] = time.perf_counter() - start
    code = proc.wait()
    total = time.perf_counter() - start
    if code != 0 or set(seen) != set(MARKS):
        raise SystemExit(f"launch verify exited {code} (see {run_dir}); marks seen: {seen}")
    return {
        "total_s": total,
        "plan_s": seen["split"],
        "split_s": seen["reference"] - seen["split"],
        "reference_and_certificate_s": total - seen["reference"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="verify_time_") as tmp:
        for n in range(args.rounds):
            rounds.append(one_round(Path(tmp) / str(n)))
            print(f"round {n + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in rounds[-1].items()))
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(
        f"launch verify parallel.dp=2 (default model), median of {args.rounds}: "
        + ", ".join(f"{k} {v:.1f}" for k, v in median.items())
        + f"; goal < 60 s: {'met' if median['total_s'] < 60 else 'NOT met'}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"rounds": rounds, "median": median}, indent=2) + "\n")


if __name__ == "__main__":
    main()
