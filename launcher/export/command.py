"""`launch export RUN [--output DIR] [export.* overrides]` and `export.at_end`: load the run's
checkpoint into its plain model on this process (any engine, any dp, no process group), write the
formats others load into a temporary sibling of the output, rename it into place."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import torch

from launcher.adapters.export import tied_trained, write_adapter
from launcher.checkpoint.files import Checkpoint
from launcher.checkpoint.weights import RUN_KEY
from launcher.config.export import ExportConfig
from launcher.config.root import RootConfig
from launcher.data.chat import load_template
from launcher.errors import ConfigError, LauncherError
from launcher.export.output import RECORD_FILE, check_output, commit, temporary_sibling
from launcher.export.weights import (
    DTYPES,
    is_transformers,
    stamp,
    write_model_config,
    write_plain,
    write_tokenizer,
    write_transformers,
)
from launcher.logs import get_logger, setup_logging
from launcher.models.adapted import base_source

log = get_logger("export")

EXPORT_DIR = "export"
USAGE = """\
usage: launch export RUN_DIR_OR_CHECKPOINT [--output DIR] [overrides]

The trained weights of a run's newest complete checkpoint (or the checkpoints/step_<N> given),
of any engine and dp, on this process: for a transformers model a directory that
AutoModelForCausalLM.from_pretrained (and AutoTokenizer, when the run had a tokenizer) loads;
otherwise model.safetensors and model.yaml (the model section that rebuilds it). Default output:
RUN/export. A new run starts from it with model=hf model.path=DIR, or model.init_from=DIR.

overrides: export.dtype=fp32|bf16|fp16  export.overwrite=true (replace a non-empty --output)
           export.merge=true (an adapter run: the merged model instead of a peft adapter directory)
"""


def apply_overrides(export: ExportConfig, overrides: dict[str, str]) -> ExportConfig:
    changes: dict[str, object] = {}
    for key, value in overrides.items():
        if key == "export.dtype":
            changes["dtype"] = value
        elif key in ("export.overwrite", "export.merge"):
            if value.lower() not in ("true", "false"):
                raise ConfigError(key, f"{value!r} is not true or false.", f"{key}=true.")
            changes[key.split(".", 1)[1]] = value.lower() == "true"
        else:
            raise ConfigError(
                key,
                "is not an option of launch export.",
                "use export.dtype, export.overwrite, export.merge.",
            )
    return dataclasses.replace(export, **changes)  # type: ignore[arg-type]


def export_run(argument: str, output: Path | None, export: ExportConfig) -> Path:
    """Export the checkpoint `argument` names; the directory written."""
    from launcher.serve.load import find_checkpoint

    run_dir, chosen = find_checkpoint(argument)
    target = (output or run_dir / EXPORT_DIR).expanduser().absolute()
    check_output(target, export.overwrite, run_dir)  # before any weight is read
    started = time.perf_counter()
    cfg, model, checkpoint = _load_while_it_lasts(argument, chosen, export.merge)
    tied = tied_trained(model) if cfg.adapter.enabled and not export.merge else []
    if tied:
        where = f" --output {output}" if output is not None else ""
        raise ConfigError(
            "export.merge",
            f"adapter.train_modules {tied[0]} shares its weight with another module (tied), "
            "which a peft adapter directory unties (modules_to_save): it would not give this "
            "run's model.",
            f"launch export {argument}{where} export.merge=true",
        )
    tmp = temporary_sibling(target)
    try:
        _write(cfg, model, checkpoint.path, checkpoint.step, tmp, export)
        commit(tmp, target, export.overwrite, run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info(
        f"exported {checkpoint.path} (step {checkpoint.step}, {export.dtype}) to "
        f"{target} in {time.perf_counter() - started:.1f}s"
    )
    return target


def _load_while_it_lasts(
    argument: str, chosen: Checkpoint, merge: bool = True
) -> tuple[RootConfig, torch.nn.Module, Checkpoint]:
    """load_model, with one clear error when the checkpoint vanished while it was read (a run
    still training deletes its older checkpoints, checkpoint.keep)."""
    from launcher.serve.load import load_model

    try:
        return load_model(argument, torch.device("cpu"), merge=merge)
    except Exception:
        if chosen.path.exists():
            raise
        raise ConfigError(
            RUN_KEY,
            f"{chosen.path} was deleted while it was read: the run is still training and keeps "
            "only its newest checkpoints (checkpoint.keep).",
            "run the same launch export again (it takes the newest complete checkpoint), or "
            "export once the run has finished.",
        ) from None


def _write(
    cfg: RootConfig,
    model: torch.nn.Module,
    checkpoint: Path,
    step: int,
    directory: Path,
    export: ExportConfig,
) -> None:
    dtype = DTYPES[export.dtype]
    if cfg.adapter.enabled and not export.merge:  # a peft adapter directory (docs/adapters.md)
        write_adapter(
            model, cfg.adapter, base_source(cfg)[1], directory, dtype, is_transformers(model)
        )
        if not is_transformers(model):
            write_model_config(cfg, directory)
    elif is_transformers(model):
        write_transformers(model, directory, dtype)
    else:
        write_plain(model, cfg, directory, dtype)
    if cfg.data.tokenizer:
        given = cfg.data.chat_template
        template = load_template(cfg.data, Path(cfg.data.tokenizer)) if given else None
        write_tokenizer(cfg.data.tokenizer, cfg.data.eos_token, directory, template)
    record = {
        "launcher.run": str(checkpoint.parent.parent),
        "launcher.checkpoint": str(checkpoint),
        "launcher.step": str(step),
        "launcher.dtype": export.dtype,
    }
    stamp(directory, record)
    text = json.dumps(record, indent=2) + "\n"
    (directory / RECORD_FILE).write_text(text, encoding="utf-8")


def export_at_end(cfg: RootConfig, run_dir: Path) -> None:
    """export.at_end=true after `launch train` returned 0: the final checkpoint into RUN/export
    (the run's own directory: replaced by each export)."""
    from launcher.checkpoint.files import find_checkpoints

    found = find_checkpoints(run_dir, warn=False)
    if not found or found[0].step != cfg.train.steps:
        log.warning(
            f"export.at_end: {run_dir} holds no checkpoint of step {cfg.train.steps} here (a "
            f"SLURM job still running?); export it when done: launch export {run_dir}"
        )
        return
    export_run(str(run_dir), run_dir / EXPORT_DIR, dataclasses.replace(cfg.export, overwrite=True))


def _run_argument(positionals: list[str]) -> str:
    if len(positionals) == 1:
        return positionals[0]
    raise ConfigError(
        "RUN_DIR_OR_CHECKPOINT",
        f"expected one run, got {' '.join(positionals) or 'nothing'}.",
        "launch export RUN_DIR_OR_CHECKPOINT [--output DIR].",
    )


def export_main(argv: list[str]) -> int:
    from launcher.serve.options import parse_argv

    setup_logging(0)
    code = 0
    try:
        line = parse_argv(argv, "export", takes_output=True)
        if line.help:
            print(USAGE, end="")
        else:
            run = _run_argument(line.positionals)
            export = apply_overrides(ExportConfig(), line.overrides)
            export_run(run, Path(line.output) if line.output else None, export)
    except LauncherError as exc:
        get_logger().error(str(exc))
        code = exc.exit_code
    return code
