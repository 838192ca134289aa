"""One command for a short loan of GPUs: the CUDA paths the CPU tests cannot reach (issue 24).

    python -m benchmarks.gpu_check [--json gpu_check.json] [--sections mfu,memory,dp,offload,async]

On whatever CUDA devices it finds, each section bounded in time (--section-s):

- mfu: bf16 MFU of a ~1B-parameter GPT on one GPU, train.compile off and on (the median of
  the per-step MFU after the first steps, which hold start-up and compilation);
- memory: the memory plan (plan.json's planned peak) against torch.cuda.max_memory_allocated
  (summary.json's peak_memory_bytes) for ddp, fsdp and ZeRO-3 under ac none/full/selective, on
  all local GPUs (goal: within 10%);
- dp: data parallelism over all local GPUs with NCCL, fp32, the loss curve against one GPU;
- offload: FSDP2 with engine.offload=params (peak GPU memory against the plan);
- async: the checkpoint stall per save, sync and checkpoint.async=true
  (benchmarks/checkpoint_stall.py on the GPU).

Every run is a `launch train` subprocess with overrides; the figures come from its summary.json
and metrics.jsonl. A key this checkout does not have yet (train.compile, engine.offload) makes
its row "not available" instead of failing. Prints one table; --json writes the rows. Without a
CUDA device it says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
LAUNCH = [sys.executable, "-m", "launcher.cli"]
SECTIONS = ("mfu", "memory", "dp", "tp", "pp", "offload", "async")
VOCAB = 32000

# About 1.07B parameters (12 * 20 * 2048^2 in the blocks, 65M in the embedding).
GPT_1B = ["model.n_layer=20", "model.n_head=16", "model.d_model=2048", "model.seq_len=1024"]
# About 335M: the memory plan's runs, nine of them, stay short.
GPT_335M = ["model.n_layer=24", "model.n_head=16", "model.d_model=1024", "model.seq_len=1024"]
GPT_SMALL = ["model.n_layer=6", "model.n_head=6", "model.d_model=384", "model.seq_len=256"]
QUIET = ["wandb.mode=disabled", "checkpoint.enabled=false", "train.log_every=1"]


@dataclass
class Row:
    section: str
    name: str
    status: str
    """ok | off (a figure outside its goal) | not available | skipped | timeout | failed"""
    figures: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass
class Context:
    work: Path
    tokens: Path
    gpus: int
    section_s: float
    started: float = field(default_factory=time.monotonic)
    deadline: float = 0.0

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


class Timeout(Exception):
    pass


class Unavailable(Exception):
    pass


def write_tokens(path: Path, count: int = 8 << 20) -> None:
    """Random token ids: MFU and memory do not depend on what is learnt."""
    rng = np.random.default_rng(0)
    rng.integers(0, VOCAB, size=count, dtype=np.uint16).tofile(path)


def launch(args: list[str], run_dir: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    if timeout <= 1:
        raise Timeout("no time left in this section")
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    try:
        return subprocess.run(
            [*LAUNCH, *args, f"hydra.run.dir={run_dir}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise Timeout(f"over {timeout:.0f}s") from exc


def last_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(no output)"])[-1][:300]


def check_keys(ctx: Context, overrides: list[str], run_dir: Path) -> None:
    """`launch plan` with the overrides: Unavailable when it refuses one of their keys as unknown
    (a feature this checkout does not have yet)."""
    proc = launch(["plan", *overrides], run_dir, min(120.0, ctx.left()))
    if proc.returncode == 0:
        return
    text = proc.stderr + proc.stdout
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+")
        if f"{key}: no such" in text:  # `launch`'s refusal of an unknown key
            raise Unavailable(f"{key}: not in this checkout")
    raise RuntimeError(f"launch plan refused: {last_error(proc)}")


def train(ctx: Context, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """One `launch train`; its summary and metrics lines."""
    proc = launch(["train", *overrides], run_dir, ctx.left())
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {last_error(proc)}")
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    summary["metrics"] = [json.loads(line) for line in lines if line.strip()]
    return summary


def tokens_data(ctx: Context) -> list[str]:
    return ["data=tokens", f"data.path={ctx.tokens}", "data.dtype=uint16"]


def steady_mfu(summary: dict[str, Any], skip: int) -> float | None:
    values = [m["mfu"] for m in summary["metrics"][skip:] if m.get("mfu") is not None]
    return statistics.median(values) if values else None


def section_mfu(ctx: Context) -> list[Row]:
    rows = []
    base = [
        *GPT_1B,
        f"model.vocab_size={VOCAB}",
        *tokens_data(ctx),
        *QUIET,
        "train.precision=bf16",
        "train.steps=12",
        "batch.global_size=16",
        "batch.micro_size=auto",
        "parallel.dp=1",
    ]
    for compiled in (False, True):
        name = f"GPT ~1B bf16, compile {'on' if compiled else 'off'}"
        overrides = [*base, f"train.compile={str(compiled).lower()}"] if compiled else base
        run_dir = ctx.work / f"mfu_compile_{compiled}"
        try:
            if compiled:
                check_keys(ctx, overrides, run_dir.with_name(run_dir.name + "_plan"))
            s = train(ctx, overrides, run_dir)
            figures = {
                "mfu": steady_mfu(s, skip=4),
                "tokens_per_s": s.get("tokens_per_s"),
                "micro_size": s.get("micro_size"),
                "peak_memory_gib": _gib(s.get("peak_memory_bytes")),
                "device": s.get("device"),
                "compile_s": s.get("compile_s"),
            }
            rows.append(Row("mfu", name, "ok", figures))
        except Exception as exc:  # one row's failure never ends the check
            rows.append(_failed("mfu", name, exc))
    return rows


def _gib(value: Any) -> float | None:
    return round(value / 2**30, 3) if isinstance(value, (int, float)) else None


def _failed(section: str, name: str, exc: BaseException) -> Row:
    if isinstance(exc, Unavailable):
        return Row(section, name, "not available", note=str(exc))
    if isinstance(exc, Timeout):
        return Row(section, name, "timeout", note=str(exc))
    return Row(section, name, "failed", note=f"{type(exc).__name__}: {exc}"[:300])


def plan_row(section: str, name: str, s: dict[str, Any], goal: float = 0.10) -> Row:
    measured, planned = s.get("peak_memory_bytes"), s.get("planned_peak_bytes")
    figures: dict[str, Any] = {"measured_gib": _gib(measured), "planned_gib": _gib(planned)}
    if not measured or not planned:
        return Row(section, name, "failed", figures, "no measured or planned peak in summary.json")
    error = planned / measured - 1
    figures["plan_error"] = round(error, 4)
    return Row(section, name, "ok" if abs(error) <= goal else "off", figures)


def section_memory(ctx: Context) -> list[Row]:
    rows = []
    dp = ctx.gpus
    engines = {
        "ddp": ["engine=ddp"],
        "fsdp": ["engine=fsdp"],
        "zero3": ["engine=deepspeed", "engine.zero_stage=3"],
    }
    for engine, engine_args in engines.items():
        for ac in ("none", "full", "selective"):
            name = f"{engine} ac={ac} dp={dp}"
            overrides = [
                *GPT_335M,
                f"model.vocab_size={VOCAB}",
                *tokens_data(ctx),
                *QUIET,
                *engine_args,
                f"ac={ac}",
                "train.precision=bf16",
                "train.steps=3",
                f"parallel.dp={dp}",
                f"batch.global_size={2 * dp}",
                "batch.micro_size=2",
            ]
            try:
                if engine == "zero3" and importlib.util.find_spec("deepspeed") is None:
                    raise Unavailable("deepspeed is not installed (pip install deepspeed)")
                s = train(ctx, overrides, ctx.work / f"memory_{engine}_{ac}")
                rows.append(plan_row("memory", name, s))
            except Exception as exc:
                rows.append(_failed("memory", name, exc))
    return rows


def section_dp(ctx: Context) -> list[Row]:
    name = f"dp={ctx.gpus} (NCCL) vs dp=1, fp32 loss curve"
    if ctx.gpus < 2:
        return [Row("dp", name, "skipped", note="one GPU: nothing to compare")]
    global_size = 4 * ctx.gpus
    common = [
        *GPT_SMALL,
        f"model.vocab_size={VOCAB}",
        *tokens_data(ctx),
        *QUIET,
        "train.precision=fp32",
        "train.steps=20",
        f"batch.global_size={global_size}",
        "batch.micro_size=4",
    ]
    try:
        many = train(ctx, [*common, f"parallel.dp={ctx.gpus}"], ctx.work / "dp_many")
        one = train(ctx, [*common, "parallel.dp=1"], ctx.work / "dp_one")
    except Exception as exc:
        return [_failed("dp", name, exc)]
    a = [m["loss"] for m in many["metrics"]]
    b = [m["loss"] for m in one["metrics"]]
    worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))
    figures = {
        "max_rel_loss_diff": worst,
        "tokens_per_s_many": many.get("tokens_per_s"),
        "tokens_per_s_one": one.get("tokens_per_s"),
        "final_loss": a[-1],
    }
    return [Row("dp", name, "ok" if worst <= 1e-5 else "off", figures, "goal: 1e-5 relative")]


def _layout_vs_one(
    ctx: Context, key: str, name: str, split: list[str], extra: list[str]
) -> list[Row]:
    """A layout of two GPUs (`split`) against one process on the same global batches, fp32: the
    loss and gradient norm curves (goal 1e-5), tokens/s and each rank's peak memory."""
    if ctx.gpus < 2:
        return [Row(key, name, "skipped", note="one GPU: nothing to split")]
    common = [
        *GPT_SMALL,
        f"model.vocab_size={VOCAB}",
        *tokens_data(ctx),
        *QUIET,
        "engine=fsdp",
        "train.precision=fp32",
        "train.steps=20",
        "batch.global_size=8",
        *extra,
    ]
    try:
        two = train(ctx, [*common, *split], ctx.work / f"{key}2")
        one = train(ctx, common, ctx.work / f"{key}1")
    except Exception as exc:
        return [_failed(key, name, exc)]
    worst = 0.0
    for metric in ("loss", "grad_norm"):
        a = [m[metric] for m in two["metrics"]]
        b = [m[metric] for m in one["metrics"]]
        worst = max(worst, *(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True)))
    figures = {
        "max_rel_diff": worst,
        f"tokens_per_s_{key}2": two.get("tokens_per_s"),
        f"tokens_per_s_{key}1": one.get("tokens_per_s"),
        f"peak_gib_{key}2": _gib(two.get("peak_memory_bytes")),
        f"peak_gib_{key}1": _gib(one.get("peak_memory_bytes")),
    }
    return [Row(key, name, "ok" if worst <= 1e-5 else "off", figures, "goal: 1e-5 relative")]


def section_tp(ctx: Context) -> list[Row]:
    """Tensor parallelism inside the node: tp=2 against tp=1."""
    name = "tp=2 (NCCL, sequence parallel) vs tp=1, fp32"
    return _layout_vs_one(ctx, "tp", name, ["parallel.tp=2"], ["batch.micro_size=8"])


def section_pp(ctx: Context) -> list[Row]:
    """Pipeline parallelism: two stages under 1F1B (the accumulation's 4 micro-batches streamed
    through them) against one process taking the same 4 micro-batches in turn."""
    name = "pp=2 (NCCL, 1f1b, 4 micro-batches) vs pp=1, fp32"
    split = ["parallel.pp=2", "parallel.pp_schedule=1f1b"]
    return _layout_vs_one(ctx, "pp", name, split, ["batch.grad_accum=4"])


def section_offload(ctx: Context) -> list[Row]:
    name = "fsdp engine.offload=params, GPT ~335M bf16"
    overrides = [
        *GPT_335M,
        f"model.vocab_size={VOCAB}",
        *tokens_data(ctx),
        *QUIET,
        "engine=fsdp",
        "engine.offload=params",
        "train.precision=bf16",
        "train.steps=4",
        f"parallel.dp={ctx.gpus}",
        f"batch.global_size={2 * ctx.gpus}",
        "batch.micro_size=2",
    ]
    try:
        check_keys(ctx, overrides, ctx.work / "offload_plan")
        s = train(ctx, overrides, ctx.work / "offload")
    except Exception as exc:
        return [_failed("offload", name, exc)]
    row = plan_row("offload", name, s)
    row.figures["tokens_per_s"] = s.get("tokens_per_s")
    return [row]


def section_async(ctx: Context) -> list[Row]:
    name = "checkpoint stall per save, GPT ~100M on one GPU"
    out = ctx.work / "stall.json"
    argv = [sys.executable, "-m", "benchmarks.checkpoint_stall", "--device", "cuda"]
    argv += ["--steps", "6", "--every", "2", "--json", str(out)]
    try:
        if ctx.left() <= 1:
            raise Timeout("no time left in this section")
        proc = subprocess.run(
            argv, cwd=REPO, capture_output=True, text=True, timeout=ctx.left(), check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"exit {proc.returncode}: {last_error(proc)}")
        result = json.loads(out.read_text())
    except subprocess.TimeoutExpired:
        return [Row("async", name, "timeout", note=f"over {ctx.section_s:.0f}s")]
    except Exception as exc:
        return [_failed("async", name, exc)]
    sync, done = result["rows"]
    figures = {
        "sync_stall_s": round(sync["stall_mean_s"], 3),
        "async_stall_s": round(done["stall_mean_s"], 3),
        "stall_ratio": round(result["stall_ratio"], 4),
        "async_final_wait_s": round(done["final_save_s"], 3),
    }
    return [Row("async", name, "ok", figures)]


RUNNERS = {
    "mfu": section_mfu,
    "memory": section_memory,
    "dp": section_dp,
    "tp": section_tp,
    "pp": section_pp,
    "offload": section_offload,
    "async": section_async,
}


def render(rows: list[Row]) -> str:
    header = ("section", "check", "status", "figures")
    cells = [
        (
            r.section,
            r.name,
            r.status,
            ", ".join(f"{k}={_shown(v)}" for k, v in r.figures.items())
            + (f" {r.note}" if r.note else ""),
        )
        for r in rows
    ]
    widths = [max(len(str(c[i])) for c in [header, *cells]) for i in range(3)]
    lines = []
    for c in [header, *cells]:
        lines.append("  ".join(str(c[i]).ljust(widths[i]) for i in range(3)) + "  " + c[3])
    return "\n".join(lines)


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def cuda_devices() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma list of sections")
    parser.add_argument("--section-s", type=float, default=240.0, help="time bound per section")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {','.join(SECTIONS)}")
    devices = cuda_devices()
    report: dict[str, Any] = {"cuda_devices": devices, "rows": []}
    if not devices:
        print("gpu_check: found no CUDA device; nothing to check.")
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        return 0
    print(
        f"gpu_check: {len(devices)} CUDA device(s): {', '.join(sorted(set(devices)))}", flush=True
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = Path(tmp)
        tokens = work / "tokens.bin"
        write_tokens(tokens)
        ctx = Context(work, tokens, len(devices), args.section_s)
        for section in chosen:
            ctx.deadline = time.monotonic() + args.section_s
            started = time.monotonic()
            found = RUNNERS[section](ctx)
            for row in found:
                print(
                    f"  {row.section}: {row.name}: {row.status} {row.figures} {row.note}",
                    flush=True,
                )
            rows += found
            print(f"gpu_check: {section} took {time.monotonic() - started:.0f}s", flush=True)
    report["rows"] = [asdict(r) for r in rows]
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
