"""LoRA vs full fine-tuning on the same model and batch (issue 34): step time, peak memory,
checkpoint size, trainable parameters.

Each round runs `launch train` twice in fresh processes, full then LoRA (the order alternates
between rounds), on the same model, data, split and seed; a run's step time is the median over its
steps after the first two (step_time_s of metrics.jsonl), its peak the
measured `peak_memory_bytes` of summary.json (the CPU meter: every live tensor; on CUDA the
allocator's peak), its planned peak from plan.json, its checkpoint the bytes of the final
checkpoint's engine/ directory. Reported: the medians over rounds and the LoRA / full ratios.

    .venv/bin/python -m benchmarks.lora_vs_full [--rounds 3] [--steps 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COMMON = [
    "model=small",  # 6 blocks, d_model 384, seq_len 256
    "batch.global_size=8",
    "batch.micro_size=8",
    "train.precision=fp32",
    "model.dropout=0",
    "wandb.mode=disabled",
    "data.eval_problems=1",
]
LORA = ["adapter=lora", "adapter.rank=8", "adapter.targets=[all-linear]"]


def run(args: list[str], run_dir: Path, steps: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "launcher.cli", "train", *COMMON, *args]
    command += [f"train.steps={steps}", f"hydra.run.dir={run_dir}"]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text())
    step_s = statistics.median(m["step_time_s"] for m in metrics[2:])
    step = max((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    engine = sum(f.stat().st_size for f in (step / "engine").rglob("*") if f.is_file())
    return {
        "step_ms": step_s * 1000,
        "peak_bytes": summary["peak_memory_bytes"],
        "planned_peak_bytes": plan["planned_peak_bytes"],
        "checkpoint_bytes": engine,
        "gradients_bytes": plan["memory_plan"]["parts"]["gradients"],
        "optimizer_bytes": plan["memory_plan"]["parts"]["optimizer_state"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"full": [], "lora": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ["full", "lora"] if r % 2 == 0 else ["lora", "full"]
            for name in order:
                extra = LORA if name == "lora" else []
                results[name].append(run(extra, Path(tmp) / f"{name}{r}", args.steps))
    table = {
        name: {key: statistics.median(x[key] for x in rows) for key in rows[0]}
        for name, rows in results.items()
    }
    ratios = {key: table["lora"][key] / table["full"][key] for key in table["full"]}
    print(f"{'':<20}{'full':>14}{'lora':>14}{'lora/full':>11}")
    for key in table["full"]:
        full, lora = table["full"][key], table["lora"][key]
        unit = 1 if key == "step_ms" else 2**20
        label = key.replace("_bytes", " MiB")
        print(f"{label:<20}{full / unit:>14,.1f}{lora / unit:>14,.1f}{ratios[key]:>11.3f}")
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "median": table, "ratios": ratios}))


if __name__ == "__main__":
    main()
