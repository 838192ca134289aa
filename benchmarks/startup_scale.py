"""`launch train` start-up against the size of a token corpus (issue 32): 1e7 and 1e9 uint16
tokens (20 MB and 2 GB, written under /tmp and deleted afterwards), each launched twice with the
same launcher cache directory: the first launch reads the file whole (the vocabulary check, and
the data identity that the final checkpoint records), the second only stats it.

The corpus's pages are dropped from the page cache before each launch (posix_fadvise on the file
written here): a first launch reads it from the disk. Each round starts with a fresh, empty cache
directory ($LAUNCHER_CACHE_DIR), so every round has one first and one second launch per size.
Reported: the median wall time until the first step is logged (`step 1/`), of the whole command
(one step, one checkpoint), and the command's CPU time (user + system, its in-process worker
included: the figure a loaded machine disturbs least); and the vocabulary check alone (a cold
read, then a cached one) in a fresh process.

model.seq_len=1024 (--seq-len): 1e9 tokens are about 1M samples. The sample order is a separate
cost that grows with the number of samples (issue 32's sampler part, not measured here).

    .venv/bin/python -m benchmarks.startup_scale [--rounds 3] [--sizes 1e7 1e9] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 1 << 24
TIMES = ("to_step_s", "wall_s", "cpu_s")


def write_corpus(path: Path, tokens: int) -> None:
    """`tokens` uint16 ids below 256 (the built-in model's vocabulary), a repeated pattern."""
    pattern = (np.arange(CHUNK, dtype=np.uint64) * 7 % 256).astype(np.uint16)
    with open(path, "wb") as f:
        left = tokens
        while left:
            n = min(left, CHUNK)
            pattern[:n].tofile(f)
            left -= n


def evict(path: Path) -> None:
    """Drop this file's pages from the page cache (ours, written here): the next read is from
    the disk, as for a corpus not read lately."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def check_alone(corpus: Path, cache: Path) -> dict[str, float]:
    """The vocabulary check by itself, in a fresh process: a cold first read, then a cached one."""
    code = (
        "import sys, time; from pathlib import Path\n"
        "from launcher.integrity import token_scan as t\n"
        "p = Path(sys.argv[1]); s = time.perf_counter(); t.max_token_id(p, 'uint16')\n"
        "a = time.perf_counter() - s; t._seen.clear(); s = time.perf_counter()\n"
        "t.max_token_id(p, 'uint16'); print(a, time.perf_counter() - s)"
    )
    evict(corpus)
    env = {**os.environ, "LAUNCHER_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(corpus)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    first, cached = map(float, out.stdout.split())
    return {"first_s": first, "cached_s": cached}


def launch(corpus: Path, run_dir: Path, cache: Path, seq_len: int) -> dict[str, float | bool]:
    argv = [sys.executable, "-m", "launcher.cli", "train", "model=tiny", "data=tokens"]
    argv += [f"model.seq_len={seq_len}", "batch.global_size=8"]
    argv += [f"data.path={corpus}", "train.steps=1", "wandb.mode=disabled"]
    argv += [f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "LAUNCHER_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    env |= {"WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    evict(corpus)
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    first_step, scanned, out = None, False, []
    for line in proc.stdout:
        out.append(line)
        scanned = scanned or "vocabulary check: read" in line
        if first_step is None and line.startswith("step 1/"):
            first_step = time.perf_counter() - start
    if proc.wait() != 0 or first_step is None:
        raise SystemExit(f"{' '.join(argv)} failed:\n{''.join(out)}")
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    return {"to_step_s": first_step, "wall_s": wall, "cpu_s": cpu, "read": scanned}


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (the launch and its worker)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e7, 1e9])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes]
    need = 2 * max(sizes) + (1 << 30)
    with tempfile.TemporaryDirectory(prefix="startup-scale-") as tmp:
        free = shutil.disk_usage(tmp).free
        if free < need:
            raise SystemExit(f"{tmp}: {free / 2**30:.1f} GiB free, {need / 2**30:.1f} needed")
        root = Path(tmp)
        times: dict[str, list[dict[str, float | bool]]] = {}
        for tokens in sizes:
            corpus = root / f"corpus-{tokens}.bin"
            write_corpus(corpus, tokens)
            try:
                alone = check_alone(corpus, root / f"cache-{tokens}-alone")
                print(f"{tokens:.0e} tokens, the check alone: {alone}", flush=True)
                for r in range(args.rounds):
                    cache = root / f"cache-{tokens}-{r}"
                    for which in ("first", "second"):
                        got = launch(
                            corpus, root / f"run-{tokens}-{r}-{which}", cache, args.seq_len
                        )
                        times.setdefault(f"{tokens:.0e} {which}", []).append(got)
                        print(f"{tokens:.0e} tokens, {which} launch: {got}", flush=True)
            finally:
                corpus.unlink()
    result = {
        name: {k: statistics.median(float(t[k]) for t in runs) for k in TIMES}
        | {"read": [bool(t["read"]) for t in runs]}
        for name, runs in times.items()
    }
    print("| corpus | launch | to the first step | whole command | its CPU time | read whole |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for name, r in result.items():
        size, which = name.split()
        read = "yes" if all(r["read"]) else "no" if not any(r["read"]) else "mixed"
        step, wall, cpu = (f"{r[k]:.2f} s" for k in TIMES)
        print(f"| {size} tokens | {which} | {step} | {wall} | {cpu} | {read} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
