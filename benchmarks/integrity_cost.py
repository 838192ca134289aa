"""What data identity and checkpoint checksums cost (issue 22).

1. Data identity of a 1 GiB token file (written under /tmp, deleted afterwards): the first
   digest (a full read) and a cached one (size, mtime and inode match: no read).
2. Checkpoint checksums: a real save of `model=small` and of a ~100M-parameter GPT (one training
   step, then Checkpointer.save on one gloo rank), timed whole, and the digest part of it
   (manifest) and the verification before a load (damaged_file) timed alone, with a cold
   in-process digest memo.

    .venv/bin/python -m benchmarks.integrity_cost
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from launcher.checkpoint.checkpointer import Checkpointer
from launcher.checkpoint.files import damaged_file, find_checkpoints, manifest
from launcher.config import to_root_config
from launcher.config.data import DataConfig, DataKind
from launcher.distributed import init_distributed, teardown_distributed
from launcher.engines import build_engine
from launcher.integrity import digests
from launcher.integrity.data import data_identity
from launcher.tracking.tracker import Tracker
from launcher.training.loop import Trainer
from launcher.worker.run import build_data, build_model

GIB = 1 << 30


def data_cost(directory: Path) -> dict[str, float]:
    path = directory / "tokens_1gib.bin"
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for _ in range(GIB // (64 << 20)):
            f.write(rng.integers(0, 65535, size=32 << 20, dtype=np.uint16).tobytes())
    try:
        cfg = DataConfig(name=DataKind.tokens, path=str(path))
        digests._seen.clear()
        started = time.perf_counter()
        data_identity(cfg)
        first = time.perf_counter() - started
        digests._seen.clear()  # a new process: only the on-disk cache
        started = time.perf_counter()
        data_identity(cfg)
        cached = time.perf_counter() - started
    finally:
        path.unlink()
    return {"first_s": first, "cached_s": cached}


def checkpoint_cost(model: dict[str, object], run_dir: Path) -> dict[str, float]:
    cfg = to_root_config(
        {
            "model": model,
            "batch": {"global_size": 1},
            "train": {"steps": 1},
            "wandb": {"mode": "disabled"},
        }
    )
    ctx = init_distributed("cpu")
    try:
        net = build_model(cfg)
        params = sum(p.numel() for p in net.parameters())
        engine = build_engine(cfg, net, ctx)
        tracker = Tracker(run_dir, 1, 1, enabled=False)
        trainer = Trainer(cfg, ctx, engine, build_data(cfg, net).train, tracker)
        trainer.train_step(0)
        trainer.step = 1
        saver = Checkpointer(cfg, run_dir, ctx, trainer)
        started = time.perf_counter()
        saved = saver.save()
        save_s = time.perf_counter() - started
    finally:
        teardown_distributed()
    size = sum(p.stat().st_size for p in saved.rglob("*") if p.is_file())
    digests._seen.clear()
    started = time.perf_counter()
    manifest(saved)
    digest_s = time.perf_counter() - started
    digests._seen.clear()
    started = time.perf_counter()
    assert damaged_file(saved) is None and find_checkpoints(run_dir, verify=False)
    verify_s = time.perf_counter() - started
    return {
        "params_m": params / 1e6,
        "checkpoint_mib": size / 2**20,
        "save_s": save_s,
        "digest_at_save_s": digest_s,
        "verify_at_load_s": verify_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        os.environ["LAUNCHER_CACHE_DIR"] = str(Path(tmp) / "cache")
        print("data identity, 1 GiB token file:", data_cost(Path(tmp)))
        small = {"name": "small", "n_layer": 6, "n_head": 6, "d_model": 384, "seq_len": 256}
        print("model=small:", checkpoint_cost(small, Path(tmp) / "small"))
        big = {"name": "100m", "n_layer": 14, "n_head": 12, "d_model": 768, "seq_len": 64}
        print("~100M GPT:", checkpoint_cost(big, Path(tmp) / "big"))


if __name__ == "__main__":
    main()
