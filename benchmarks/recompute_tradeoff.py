"""The memory/compute trade-off of every activation-checkpoint granularity, side by side.

One GPT (12 blocks by default) on CPU, one micro-batch: per granularity the measured activation
bytes at the end of forward, the peak activation bytes over forward and backward, the FLOPs ratio
against no recompute (FlopCounterMode) and the training-step time ratio against no recompute.
The policies share one model (only `run_blocks` changes) and are timed round-robin, one step of
each per round in a rotating order, so machine noise hits them alike; the ratio is of median
step times. A step is forward, backward and an AdamW step, in fp32, dropout 0, on one thread by
default (steadier on a shared machine).

    .venv/bin/python -m benchmarks.recompute_tradeoff [--rounds 15] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from launcher.config.ac import AcConfig, AcPolicy
from launcher.config.model import ModelConfig
from launcher.models import GPT
from launcher.recompute.measure import count_flops, measure_activations
from launcher.recompute.policies import build_runner
from launcher.training.loss import token_loss_sum


def step(
    model: GPT, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor
) -> float:
    start = time.perf_counter()
    token_loss_sum(model(inputs), targets).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layer=args.n_layer, n_head=args.n_head, d_model=args.d_model, seq_len=args.seq_len
    )
    model = GPT(cfg)
    model.train()
    inputs = torch.randint(0, cfg.vocab, (args.micro_size, cfg.seq_len))
    targets = torch.randint(0, cfg.vocab, (args.micro_size, cfg.seq_len))
    runners = {
        p.value: build_runner(AcConfig(policy=p, every_n=args.every_n), model.blocks)
        for p in AcPolicy
    }

    rows: dict[str, dict[str, Any]] = {}
    for name, runner in runners.items():
        model.run_blocks = runner
        model.zero_grad(set_to_none=True)
        measured = measure_activations(model, inputs, targets)
        model.zero_grad(set_to_none=True)
        flops = count_flops(model, inputs, targets)
        rows[name] = {
            "policy": name,
            "activation_bytes": measured.saved,
            "activation_peak_bytes": measured.peak,
            "flops": flops,
            "times": [],
        }

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    names = list(runners)
    for r in range(args.warmup + args.rounds):
        # A different policy goes first each round, so no policy always follows the same one.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runner = runners[name]
            model.run_blocks = runner
            seconds = step(model, optimizer, inputs, targets)
            if r >= args.warmup:
                rows[name]["times"].append(seconds)

    none = rows[AcPolicy.none.value]
    base_time = statistics.median(none["times"])
    for row in rows.values():
        row["step_s"] = statistics.median(row.pop("times"))
        row["time_ratio"] = row["step_s"] / base_time
        row["flops_ratio"] = row["flops"] / none["flops"]
        row["bytes_vs_none"] = row["activation_bytes"] / none["activation_bytes"]
        row["peak_vs_none"] = row["activation_peak_bytes"] / none["activation_peak_bytes"]
    return list(rows.values())


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"GPT {args.n_layer} blocks, d_model {args.d_model}, {args.n_head} heads, seq_len "
        f"{args.seq_len}, micro-batch {args.micro_size}, fp32, ac.every_n={args.every_n}; "
        f"{torch.get_num_threads()} CPU threads, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}; "
        f"median of {args.rounds} rounds after {args.warmup} warm-up",
        "",
        "| ac | activation MiB (vs none) | peak MiB (vs none) | FLOPs ratio | step ms | step-time "
        "ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['activation_bytes'] / 2**20:.1f} ({r['bytes_vs_none']:.2f}) "
            f"| {r['activation_peak_bytes'] / 2**20:.1f} ({r['peak_vs_none']:.2f}) "
            f"| {r['flops_ratio']:.3f} | {r['step_s'] * 1e3:.0f} | {r['time_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-layer", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-size", type=int, default=8)
    parser.add_argument("--every-n", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if args.n_layer < 12:
        parser.error("the trade-off table is for a GPT of at least 12 blocks")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args)
    print(table(rows, args))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
