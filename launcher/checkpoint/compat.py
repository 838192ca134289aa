"""What a resumed run must share with its checkpoint: the config fingerprint, and an engine that
reads the checkpoint's format into this many ranks (launcher/checkpoint/files.py finds the
checkpoints; launcher/checkpoint/checkpointer.py loads them)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from launcher.config.data import CONCAT, DataConfig
from launcher.config.model import QKV_ROWS_KEY
from launcher.config.root import RootConfig
from launcher.config.sources import expand, names_many
from launcher.data.packing import PLACEMENT
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
ORDER_KEY = "data.order"
DOCUMENTS_KEY = "data.cross_document_attention"
LEGACY_ORDER = "randperm"
"""The sample order of checkpoints written before the order was recorded in the fingerprint."""


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
        ORDER_KEY: d.order.value,
        **({"data.sources": sources_fingerprint(d)} if d.sources else {}),
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
    keys += ("messages_field", "cross_document_attention")
    plain = {k: getattr(d, k) for k in keys if k != "tokenizer" or not _local(d.tokenizer)}
    plain["dtype"] = d.dtype.value
    if d.messages_field is not None:
        plain["train_on"] = d.train_on.value
        plain["chat_template"] = _template_digest(d.chat_template)
    if d.packing is True:
        plain["packing_layout"] = PLACEMENT  # records placed whole: the algorithm's version
    return {f"data.{k}": v for k, v in plain.items()}


def sources_fingerprint(d: DataConfig) -> list[dict[str, Any]]:
    """A mixture's sources as they set its samples: names, weights, fields, and paths that are not
    local files (local ones are judged by their content: launcher/integrity/data.py)."""
    out = []
    for s in d.sources:
        entry: dict[str, Any] = {"name": s.name, "weight": s.weight}
        entry["dtype"] = (s.dtype or d.dtype).value
        entry["text_field"] = s.text_field or d.text_field
        if not _local(s.path):
            entry["path"] = s.path
        out.append(entry)
    return out


def _template_digest(value: str | None) -> str | None:
    """A chat template file by its content (a copy elsewhere resumes), a template's text as is."""
    if value is not None and _local(value) and Path(value).expanduser().is_file():
        return "sha256:" + hashlib.sha256(Path(value).expanduser().read_bytes()).hexdigest()
    return value


def _local(value: Any) -> bool:
    """A file or directory on this machine: judged by its content, whose size and digest the
    checkpoint's data identity records (launcher/integrity/data.py), not by its path, so a
    byte-for-byte copy elsewhere (a job's scratch directory) resumes. A dataset name is compared
    as it is. A list or glob: local when every file it names is."""
    if names_many(value):
        files = expand(value)
        return bool(files) and all(f.exists() for f in files)
    return bool(value) and Path(str(value)).expanduser().exists()


def check_compatible(meta: dict[str, Any], cfg: RootConfig, path: Path, warn: bool = True) -> None:
    """Raise ConfigError naming every setting that differs from checkpoint `path`.

    train.steps alone may change (to train on, or stop sooner): the schedule is rebuilt from the
    new length, so the learning rate follows the new cosine from here on, with a warning (unless
    `warn` is false: it was given already).
    """
    saved, now = dict(meta.get("fingerprint", {})), fingerprint(cfg)
    if saved and ORDER_KEY not in saved:
        check_legacy_order(cfg, path)
        saved[ORDER_KEY] = LEGACY_ORDER
    if saved:
        _before_document_masks(saved)
        _before_qkv_rows_by_head(saved, now, path)
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
        restore = " ".join(
            "data.sources as in the checkpoint's run (its config.yaml)"
            if k == "data.sources"
            else f"{k}={saved[k]}"
            for k in changed
        )
        raise ConfigError(
            changed,
            f"changed since checkpoint {path} was saved ({diffs}); a resumed run must keep the "
            "model shape, global batch, seed, data and optimizer settings.",
            f"resume with {restore}, or start a new run elsewhere (hydra.run.dir=...), or discard "
            "the checkpoints with train.resume=never checkpoint.overwrite=true.",
        )
    check_engine_format(meta, cfg, path)


def _before_qkv_rows_by_head(saved: dict[str, Any], now: dict[str, Any], path: Path) -> None:
    """The built-in GPT's qkv rows were [q; k; v] whole before they were grouped by head: the
    same shapes in another order, so loading such a checkpoint would train a scrambled model."""
    if QKV_ROWS_KEY in now and "model.n_layer" in saved and QKV_ROWS_KEY not in saved:
        raise ConfigError(
            "train.resume",
            f"checkpoint {path} was written by a launcher before 2026-12-04, whose built-in GPT "
            "ordered its fused qkv rows [q; k; v]; they are grouped by head now (tensor "
            "parallelism), so its weights would load scrambled.",
            "start a new run elsewhere (hydra.run.dir=...), or discard the checkpoints with "
            "train.resume=never checkpoint.overwrite=true.",
        )


def _before_document_masks(saved: dict[str, Any]) -> None:
    """A checkpoint from before document masks (no data.cross_document_attention) said what it
    trained on in today's words: its data=hf windows were concatenated with attention across
    documents when it pretrained or packed, and data.packing=true meant concatenate-and-cut then.
    So resuming it asks for those settings by name instead of training on other windows."""
    if DOCUMENTS_KEY in saved or saved.get("data.name") != "hf":
        return
    if saved.get("data.packing") is True:
        saved["data.packing"] = CONCAT
    pretraining = saved.get("data.prompt_field") is None
    saved[DOCUMENTS_KEY] = pretraining or saved.get("data.packing") == CONCAT


def check_legacy_order(cfg: RootConfig, path: Path) -> None:
    """A checkpoint written before the sample order was recorded trained on randperm's order; it
    resumes with that order only (data.order=randperm), bitwise as before."""
    if cfg.data.order.value != LEGACY_ORDER:
        raise ConfigError(
            ORDER_KEY,
            f"checkpoint {path} was written before the sample order was recorded, so with the "
            f"randperm order; data.order={cfg.data.order.value} would train on other samples "
            "from here on.",
            f"resume with {ORDER_KEY}={LEGACY_ORDER} (the same samples as before, bitwise), or "
            "start a new run elsewhere (hydra.run.dir=...).",
        )


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
