"""What a resumed run must share with its checkpoint: the config fingerprint, and an engine that
reads the checkpoint's format into this many ranks (launcher/checkpoint/files.py finds the
checkpoints; launcher/checkpoint/checkpointer.py loads them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.config.data import DataConfig
from launcher.config.root import RootConfig
from launcher.engines import (
    checkpoint_formats_note,
    engine_spec,
    engine_spec_named,
    reshardable_engines,
)
from launcher.errors import ConfigError
from launcher.logs import get_logger

log = get_logger("checkpoint")

STEPS_KEY = "train.steps"


def fingerprint(cfg: RootConfig) -> dict[str, Any]:
    """Settings a resumed run must share with its checkpoint: the model's shape, the global
    batch, the seed, the data, the optimizer and the schedule's length (together they fix the
    trajectory; the optimizer and scheduler states loaded from the checkpoint would silently
    override a changed optim.* or train.steps). The split into ranks and micro-batches, the engine
    (where it can reshard), recompute and logging may change."""
    m, d, o = cfg.model, cfg.data, cfg.optim
    optim = {
        f"optim.{key}": getattr(o, key)
        for key in (
            "lr",
            "min_lr_ratio",
            "warmup_steps",
            "weight_decay",
            "beta1",
            "beta2",
            "eps",
            "grad_clip",
        )
    }
    return {
        **optim,
        STEPS_KEY: cfg.train.steps,
        **({} if _local(d.path) else {"data.path": d.path}),
        "data.min_len": d.min_len,
        "data.max_len": d.max_len,
        "data.alphabet": d.alphabet,
        **data_fingerprint(d),
        **m.fingerprint(),  # the model's shape (a user model: its target and arguments)
        "batch.global_size": cfg.split().global_size,
        "train.seed": cfg.train.seed,
        "data.name": cfg.data.name.value,
        **cfg.adapter.fingerprint(),
    }


def data_fingerprint(d: DataConfig) -> dict[str, Any]:
    """The data keys that change which samples are trained on (not val_path: validation only)."""
    keys: tuple[str, ...] = (
        "dtype",
        "tokenizer",
        "text_field",
        "prompt_field",
        "completion_field",
        "packing",
    )
    keys += ("split", "eos_token", "holdout", "_target_", "args")
    plain = {k: getattr(d, k) for k in keys if k != "tokenizer" or not _local(d.tokenizer)}
    plain["dtype"] = d.dtype.value
    return {f"data.{k}": v for k, v in plain.items()}


def _local(value: str | None) -> bool:
    """A file or directory on this machine: judged by its content, whose size and digest the
    checkpoint's data identity records (launcher/integrity/data.py), not by its path, so a
    byte-for-byte copy elsewhere (a job's scratch directory) resumes. A dataset name is compared
    as it is."""
    return bool(value) and Path(str(value)).expanduser().exists()


def check_compatible(meta: dict[str, Any], cfg: RootConfig, path: Path, warn: bool = True) -> None:
    """Raise ConfigError naming every setting that differs from checkpoint `path`.

    train.steps alone may change (to train on, or stop sooner): the schedule is rebuilt from the
    new length, so the learning rate follows the new cosine from here on, with a warning (unless
    `warn` is false: it was given already).
    """
    saved, now = meta.get("fingerprint", {}), fingerprint(cfg)
    changed = [k for k in now if k in saved and saved[k] != now[k]]
    if STEPS_KEY in changed:
        changed.remove(STEPS_KEY)
        if warn:
            log.warning(
                f"{STEPS_KEY} changed from {saved[STEPS_KEY]} to {now[STEPS_KEY]} since "
                f"checkpoint {path}: the learning-rate schedule is stretched to the new length "
                "from here on."
            )
    if changed:
        diffs = ", ".join(f"{k}={saved[k]} in the checkpoint, {now[k]} now" for k in changed)
        restore = " ".join(f"{k}={saved[k]}" for k in changed)
        raise ConfigError(
            changed,
            f"changed since checkpoint {path} was saved ({diffs}); a resumed run must keep the "
            "model shape, global batch, seed, data and optimizer settings.",
            f"resume with {restore}, or start a new run elsewhere (hydra.run.dir=...), or discard "
            "the checkpoints with train.resume=never checkpoint.overwrite=true.",
        )
    check_engine_format(meta, cfg, path)


def check_engine_format(meta: dict[str, Any], cfg: RootConfig, path: Path) -> None:
    """The engine now must read the checkpoint's format, into this many ranks (its spec says)."""
    spec, engine = engine_spec(cfg.engine.name), cfg.engine.name.value
    saved_engine = str(meta.get("engine", "ddp"))  # meta.json without "engine": a DCP checkpoint
    saved_spec = engine_spec_named(saved_engine)
    if saved_spec is None or saved_spec.checkpoint_format != spec.checkpoint_format:
        raise ConfigError(
            "engine",
            f"checkpoint {path} was saved by engine={saved_engine}; engine={engine} cannot read it "
            f"({checkpoint_formats_note()}).",
            f"resume with engine={saved_engine}, or start a new run elsewhere (hydra.run.dir=...).",
        )
    if not spec.reshardable and meta.get("world_size") != cfg.parallel.dp:
        raise ConfigError(
            "parallel.dp",
            f"checkpoint {path} was saved by {meta.get('world_size')} {spec.label} ranks; "
            f"{spec.label} cannot load it into {cfg.parallel.dp} ({spec.reshard_note}).",
            f"resume with parallel.dp={meta.get('world_size')}, or use "
            f"engine={'/'.join(reshardable_engines())}, whose checkpoints reshard.",
        )
