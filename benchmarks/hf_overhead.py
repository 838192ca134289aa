"""Launcher vs a hand-written DDP loop with no_sync on a transformers model, 2 gloo ranks.

The model is a small Llama built by transformers from a config with random weights (fp32,
dropout 0); the data a flat uint16 token file written here. The launcher side is what
`launch train` runs on each rank for

    parallel.dp=2 model=hf model.config=CONFIG.json data=tokens data.path=TRAIN.bin ...

(the config composed by Hydra from those overrides, the model built by the `model=hf` path,
launcher/models/hf.py, the data by `data=tokens`, the real loop `Trainer.advance`). The hand
side is the textbook Hugging Face + DDP loop: `AutoModelForCausalLM.from_config` with the same
seed, `DistributedDataParallel`, the per-micro-batch mean cross-entropy of `.logits`, `no_sync`
on all but the last micro-batch, clipping, AdamW with the same parameter groups and warmup +
cosine schedule, reading its windows straight from the memory-mapped file. Both train the same
windows in the same split (the launcher's global-batch order, dp 2 x accumulation 2), in the same
two processes, alternating round by round (and which goes first) so machine noise hits both
alike. The figure is tokens/s of each (median over rounds) and the median of the per-round
ratios launcher / hand. The two models start from identical weights and see identical batches,
so their losses must agree step for step: the benchmark checks that they do.

With --cli N it then also runs the real `launch train` CLI on the same files for N steps and
reports the median step time from its metrics.jsonl (steps after the first 2), a check that the
in-process launcher side is the speed the command gets.

    .venv/bin/python -m benchmarks.hf_overhead [--rounds 21] [--steps 2] [--cli 0]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from benchmarks.interleave import free_port

WORLD = 2
SEED = 0
LLAMA = {
    "model_type": "llama",
    "vocab_size": 1024,
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
}
SEQ_LEN = 128
GLOBAL_BATCH = 16  # sequences per optimizer step: dp 2 x accumulation 2 x micro-batch 4
GRAD_ACCUM = 2
WINDOWS = 2048  # windows of SEQ_LEN + 1 tokens in the token file (every window full)


def overrides(config: Path, tokens: Path, steps: int) -> list[str]:
    """The `launch train` command line of the launcher side."""
    return [
        f"parallel.dp={WORLD}",
        "model=hf",
        f"model.config={config}",
        f"model.seq_len={SEQ_LEN}",
        "data=tokens",
        f"data.path={tokens}",
        "data.dtype=uint16",
        f"batch.global_size={GLOBAL_BATCH}",
        f"batch.grad_accum={GRAD_ACCUM}",
        f"train.steps={steps}",
        f"train.seed={SEED}",
        "wandb.mode=disabled",
    ]


def compose(args: list[str]) -> dict[str, Any]:
    """The job config `launch train ARGS` composes (Hydra, the launcher's conf/ and schema)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from launcher.config.store import register_configs
    from launcher.resources import conf_dir

    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = hydra_compose("config", overrides=args)
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


def lr_lambda(total: int, warmup: int, min_ratio: float):
    """Linear warmup then cosine decay to min_ratio: the schedule both loops use."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


class HandLoop:
    """A Hugging Face causal LM trained by the textbook DDP loop, its data read by hand."""

    def __init__(self, config: Path, tokens: Path, optim: Any, total_steps: int) -> None:
        import transformers

        data = json.loads(config.read_text())
        hf_config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
        torch.manual_seed(SEED)
        module = transformers.AutoModelForCausalLM.from_config(hf_config)
        module.config.use_cache = False
        self.model = DistributedDataParallel(module)
        decay = [p for p in module.parameters() if p.dim() >= 2]
        no_decay = [p for p in module.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": optim.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=optim.lr,
            betas=(optim.beta1, optim.beta2),
            eps=optim.eps,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(total_steps, optim.warmup_steps, optim.min_lr_ratio)
        )
        self.clip = optim.grad_clip
        self.tokens = np.memmap(tokens, dtype=np.uint16, mode="r")
        self.losses: list[torch.Tensor] = []
        """This rank's mean loss of each step (all-reduced after the timing)."""

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.tokens[i * SEQ_LEN : (i + 1) * SEQ_LEN + 1] for i in indices]
        windows = torch.from_numpy(np.stack(rows).astype(np.int64))
        return windows[:, :-1], windows[:, 1:]

    def step(self, micro_batches: list[list[int]]) -> None:
        batches = [self.batch(indices) for indices in micro_batches]
        total = torch.zeros(())
        for m, (inputs, targets) in enumerate(batches):
            ctx = self.model.no_sync() if m < len(batches) - 1 else nullcontext()
            with ctx:
                logits = self.model(input_ids=inputs).logits
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
                (loss / len(batches)).backward()
            total += loss.detach() / len(batches)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(total)


def _rank(
    rank: int, port: int, plain: dict[str, Any], paths: dict[str, str], rounds: int, steps: int
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // WORLD))  # as torchrun's ranks get
    from benchmarks.interleave import interleaved_rounds
    from launcher.config import to_root_config
    from launcher.data.build import build_datasets, vocab_of
    from launcher.distributed import init_distributed
    from launcher.engines import build_engine
    from launcher.tracking.tracker import Tracker
    from launcher.training.loop import Trainer
    from launcher.worker.run import build_model

    ctx = init_distributed("cpu")
    cfg = to_root_config(plain)
    model = build_model(cfg)  # seeded with train.seed, built by launcher.models.hf.build_hf
    engine = build_engine(cfg, model, ctx)
    data = build_datasets(cfg.data, cfg.model.seq_len, cfg.train.seed, vocab_of(model))
    out = Path(paths["out"])
    trainer = Trainer(cfg, ctx, engine, data.train, Tracker(out, 1, 1, enabled=False))
    launcher_losses: list[float | None] = []
    log_step = trainer.tracker.log_step

    def record(metrics: Any) -> None:
        launcher_losses.append(metrics.loss)
        log_step(metrics)

    trainer.tracker.log_step = record  # type: ignore[method-assign]
    hand = HandLoop(Path(paths["config"]), Path(paths["tokens"]), cfg.optim, cfg.train.steps)
    for (name, a), b in zip(
        engine.module.state_dict().items(), hand.model.module.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), f"the two models start apart at {name}"
    split = cfg.split()
    step_index = 0

    def hand_once() -> None:
        nonlocal step_index
        hand.step(trainer.sampler.micro_batches(step_index, split, rank))
        step_index += 1

    times = interleaved_rounds(trainer, hand_once, rounds, steps, "hand", alternate_order=True)
    totals = trainer.tracker.totals
    trainer.batches.close()
    hand_losses = torch.stack(hand.losses)
    dist.all_reduce(hand_losses)  # the global mean: every micro-batch has the same token count
    hand_losses /= WORLD
    result: dict[str, Any] = dict(times)
    result["launcher_data_s"] = totals.data_s / totals.steps  # every round, warm-up included
    result["launcher_comm_s"] = totals.comm_wait_s / totals.steps
    result["launcher_loss"] = launcher_losses
    result["hand_loss"] = hand_losses.tolist()
    if rank == 0:
        Path(out, "times.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def cli_step_s(command: list[str], steps: int, run_dir: Path) -> float:
    """Median step_time_s of a real `launch train` run (steps after the first 2)."""
    launch = Path(sys.executable).with_name("launch")
    args = [a for a in command if not a.startswith("train.steps=")]
    args += [f"train.steps={steps}", f"hydra.run.dir={run_dir}"]
    subprocess.run([str(launch), "train", *args], check=True, capture_output=True)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return statistics.median(r["step_time_s"] for r in records if r["step"] > 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per loop per round")
    parser.add_argument("--cli", type=int, default=0, help="steps of a real `launch train` run")
    parser.add_argument("--json", type=Path, help="also write the raw times here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        paths = {
            "out": out,
            "config": str(Path(out, "llama.json")),
            "tokens": str(Path(out, "train.bin")),
        }
        Path(paths["config"]).write_text(json.dumps(LLAMA))
        rng = np.random.default_rng(SEED)
        tokens = rng.integers(0, LLAMA["vocab_size"], WINDOWS * SEQ_LEN + 1, dtype=np.uint16)
        tokens.tofile(paths["tokens"])
        total_steps = (args.rounds + 1) * args.steps
        command = overrides(Path(paths["config"]), Path(paths["tokens"]), total_steps)
        plain = compose(command)
        mp.spawn(
            _rank,
            args=(free_port(), plain, paths, args.rounds, args.steps),
            nprocs=WORLD,
            join=True,
        )
        result = json.loads(Path(out, "times.json").read_text())
        if args.cli:
            result["cli_step_s"] = cli_step_s(command, args.cli, Path(out, "run"))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    pairs = zip(result["launcher_loss"], result["hand_loss"], strict=True)
    worst = max(abs(a - b) / abs(b) for a, b in pairs)
    med = {k: statistics.median(result[k]) for k in ("launcher", "hand", "step_all_reduce")}
    ratios = [h / lo for lo, h in zip(result["launcher"], result["hand"], strict=True)]
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    faster = sum(r > 1 for r in ratios)
    tokens_per_step = GLOBAL_BATCH * SEQ_LEN
    shape = (
        f"Llama {LLAMA['num_hidden_layers']}x{LLAMA['hidden_size']}, vocab "
        f"{LLAMA['vocab_size']}, seq {SEQ_LEN}"
    )
    split = f"dp {WORLD} x accum {GRAD_ACCUM} x micro {GLOBAL_BATCH // WORLD // GRAD_ACCUM}"
    print(
        "| model | split | launcher tokens/s (step) | hand tokens/s (step) "
        f"| launcher / hand (median of {args.rounds} rounds) | step all-reduce "
        "| launcher data wait | launcher comm wait |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {shape} | {split} "
        f"| {tokens_per_step / med['launcher']:,.0f} ({med['launcher'] * 1e3:.0f} ms) "
        f"| {tokens_per_step / med['hand']:,.0f} ({med['hand'] * 1e3:.0f} ms) "
        f"| {statistics.median(ratios):.3f} (quartiles {low:.3f}-{high:.3f}, "
        f"range {min(ratios):.3f}-{max(ratios):.3f}) "
        f"| {med['step_all_reduce'] * 1e6:.0f} us ({med['step_all_reduce'] / med['launcher']:.2%}) "
        f"| {result['launcher_data_s'] * 1e6:.0f} us | {result['launcher_comm_s'] * 1e6:.0f} us |"
    )
    print(
        f"losses: {len(result['hand_loss'])} steps, launcher vs hand max relative difference "
        f"{worst:.1e} (first {result['launcher_loss'][0]:.4f}, last "
        f"{result['launcher_loss'][-1]:.4f})"
    )
    print(f"the launcher was faster in {faster} of {len(ratios)} rounds")
    if "cli_step_s" in result:
        cli = result["cli_step_s"]
        print(
            f"launch train, {args.cli} steps: median step {cli * 1e3:.0f} ms, "
            f"{tokens_per_step / cli:,.0f} tokens/s"
        )
    print("launch train " + " ".join(command))


if __name__ == "__main__":
    main()
