"""Compiled vs eager step time on the CPU (train.compile=true), for the built-in GPT at
model=small and a transformers Llama of about the same size.

Per model: two copies with the same initial weights, one with its blocks compiled in place as
`train.compile=true` does (launcher/worker/compile.py). The first compiled step is timed on its
own, with the seconds dynamo and inductor report spending on compilation (forward and backward
graphs; the on-disk inductor cache is bypassed, so this is a cold compile). Then both copies are
timed round-robin, one step of each per round in alternating order, so machine noise hits them
alike; the ratio is compiled over eager median step time. A step is forward, backward and an
AdamW step, fp32, dropout 0, ac=none.

    .venv/bin/python -m benchmarks.compile_speed [--rounds 10] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch import nn

from launcher.config.ac import AcConfig, AcPolicy
from launcher.config.model import ModelConfig
from launcher.models import GPT
from launcher.training.loss import token_loss_sum
from launcher.worker.compile import compile_blocks, compile_seconds

SMALL = {"n_layer": 6, "n_head": 6, "d_model": 384, "seq_len": 256}
"""conf/model/small.yaml."""


def build_gpt() -> nn.Module:
    return GPT(ModelConfig(**SMALL))  # type: ignore[arg-type]


def build_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=SMALL["d_model"],
        intermediate_size=4 * SMALL["d_model"],
        num_hidden_layers=SMALL["n_layer"],
        num_attention_heads=SMALL["n_head"],
        num_key_value_heads=SMALL["n_head"],
        max_position_embeddings=SMALL["seq_len"],
    )
    return LlamaForCausalLM(config)  # transformers' default attention on CPU: sdpa


def logits_of(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.logits


def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    start = time.perf_counter()
    token_loss_sum(logits_of(model(batch[:, :-1])), batch[:, 1:]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def measure(name: str, build: Callable[[], nn.Module], args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    eager = build().train()
    compiled = copy.deepcopy(eager)
    n_blocks = compile_blocks(compiled, AcConfig(policy=AcPolicy.none))
    models = {"eager": eager, "compiled": compiled}
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    batch = torch.randint(0, 256, (args.micro_size, SMALL["seq_len"] + 1))
    before = compile_seconds()
    first_step_s = step(compiled, optimizers["compiled"], batch)
    compile_s = compile_seconds() - before
    step(eager, optimizers["eager"], batch)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for r in range(args.rounds + 1):
        order = ["eager", "compiled"] if r % 2 == 0 else ["compiled", "eager"]
        for key in order:
            seconds = step(models[key], optimizers[key], batch)
            if r > 0:  # one warm-up round
                times[key].append(seconds)
    eager_s, compiled_s = (statistics.median(times[k]) for k in ("eager", "compiled"))
    return {
        "model": name,
        "parameters": sum(p.numel() for p in eager.parameters()),
        "blocks": n_blocks,
        "eager_step_s": eager_s,
        "compiled_step_s": compiled_s,
        "ratio": compiled_s / eager_s,
        "first_compiled_step_s": first_step_s,
        "compile_s": compile_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--micro-size", type=int, default=4)
    parser.add_argument("--models", default="small,llama")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    inductor_config.force_disable_caches = True  # a cold compile, every run
    builders = {"small": build_gpt, "llama": build_llama}
    rows = [measure(name, builders[name], args) for name in args.models.split(",")]
    print(
        f"torch {torch.__version__}, {platform.machine()}, {args.threads} thread(s), "
        f"micro-batch {args.micro_size} x seq {SMALL['seq_len']}, {args.rounds} rounds"
    )
    print(
        "| model | parameters | eager step ms | compiled step ms | compiled/eager | "
        "first compiled step s | compile s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['model']} | {row['parameters']:,} | {row['eager_step_s'] * 1e3:.0f} | "
            f"{row['compiled_step_s'] * 1e3:.0f} | {row['ratio']:.2f} | "
            f"{row['first_compiled_step_s']:.1f} | {row['compile_s']:.1f} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
