"""The memory plan against reality on CPU: planned vs measured peak tensor memory per rank.

For ddp, fsdp and DeepSpeed ZeRO 1-3, each with ac=none|full|selective, on two model sizes, one
`launch train` of two steps with dp=2 (gloo) each; summary.json holds the plan's peak
(`planned_peak_bytes`, from plan.json) and the measured one (`peak_memory_bytes`: live tensor
bytes at the start of step 1 plus the peak of what ops create over steps 1-2, launcher/memory/
peak.py). Prints a Markdown table and exits non-zero when a point is more than --tolerance off.
First, the time the plan takes for a 1B-parameter GPT on fake tensors (a fresh process:
`launch`'s own cost), for one policy and for ac=auto with batch.micro_size=auto.

    .venv/bin/python -m benchmarks.memory_plan [--json out.json] [--tolerance 0.15] [--only-1b]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# DeepSpeed's default reduce bucket (5e8 elements, 2 GB in fp32) would dwarf these models' state
# and hide its accounting: the benchmark sets 2e5 elements (0.8 MB), as ds_config.json records.
SMALL_BUCKET = "+engine.extra.zero_optimization.reduce_bucket_size=200000"
ENGINES = {
    "ddp": ["engine=ddp"],
    "fsdp": ["engine=fsdp"],
    "zero1": ["engine=deepspeed", "engine.zero_stage=1", SMALL_BUCKET],
    "zero2": ["engine=deepspeed", "engine.zero_stage=2", SMALL_BUCKET],
    "zero3": ["engine=deepspeed", "engine.zero_stage=3", SMALL_BUCKET],
}
POLICIES = ("none", "full", "selective")
MODELS = {
    "tiny": ["model=tiny"],
    "4x256": [
        "model=tiny",
        "model.n_layer=4",
        "model.d_model=256",
        "model.n_head=4",
        "model.seq_len=64",
    ],
}
COMMON = ["parallel.dp=2", "train.steps=2", "wandb.mode=disabled", "checkpoint.enabled=false"]


ONE_B = (
    "from launcher.config.load import to_root_config; import time, resource\n"
    "from launcher.plan import model_info, plan_split\n"
    "from launcher.runners.inprocess import InProcessRunner\n"
    "m = dict(n_layer=24, n_head=16, d_model=2048, seq_len=2048, vocab_size=50304)\n"
    "for ac, micro in (('none', 2), ('auto', 'auto')):\n"
    "    cfg = to_root_config({'model': m, 'batch': {'global_size': 8, 'micro_size': micro},\n"
    "        'ac': {'policy': ac}, 'train': {'memory_budget': '40GiB'}})\n"
    "    t = time.perf_counter(); info = model_info(cfg)\n"
    "    _, c = plan_split(cfg, info, InProcessRunner())\n"
    "    print(f'| {info.parameters:,} | ac={ac} micro={micro} | {time.perf_counter() - t:.1f} |'\n"
    "          f' {c.micro_size} / {c.policy.value} | {c.plan.peak / 2**30:.1f} |'\n"
    "          f' {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} |')\n"
)


def time_1b_plan() -> None:
    print(
        "| parameters | request | plan s | chosen micro / ac | planned peak GiB | process RSS GiB |"
    )
    print("| ---: | --- | ---: | --- | ---: | ---: |", flush=True)
    subprocess.run([sys.executable, "-c", ONE_B], check=True)


def run_point(run_dir: Path, overrides: list[str]) -> dict[str, object]:
    argv = [sys.executable, "-m", "launcher.cli", "train", *COMMON, *overrides]
    argv.append(f"hydra.run.dir={run_dir}")
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(overrides)} failed:\n{done.stdout[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    planned, measured = summary["planned_peak_bytes"], summary["peak_memory_bytes"]
    return {"planned": planned, "measured": measured, "error": planned / measured - 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--only-1b", action="store_true", help="only time the 1B plan")
    args = parser.parse_args()
    time_1b_plan()
    if args.only_1b:
        return 0
    print()
    rows: list[dict[str, object]] = []
    print("| model | engine | ac | planned MiB | measured MiB | plan error |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for model, model_args in MODELS.items():
            for engine in args.engines.split(","):
                for ac in POLICIES:
                    run_dir = Path(tmp) / f"{model}-{engine}-{ac}"
                    start = time.perf_counter()
                    point = run_point(run_dir, [*model_args, *ENGINES[engine], f"ac={ac}"])
                    point.update(model=model, engine=engine, ac=ac)
                    point["seconds"] = round(time.perf_counter() - start, 1)
                    rows.append(point)
                    print(
                        f"| {model} | {engine} | {ac} | {int(point['planned']) / 2**20:,.1f} | "  # type: ignore[call-overload]
                        f"{int(point['measured']) / 2**20:,.1f} | {float(point['error']):+.1%} |",  # type: ignore[arg-type]
                        flush=True,
                    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    worst = max(abs(float(r["error"])) for r in rows)  # type: ignore[arg-type]
    print(f"\nlargest plan error {worst:.1%} (tolerance {args.tolerance:.0%})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    raise SystemExit(main())
