"""A trained run's model, config and tokenizer, from its run directory or one of its checkpoints,
in one process without a process group, whatever engine and dp wrote the checkpoint.

- ddp, fsdp: DCP shards, read with DCP's no-dist load through the launcher's restricted loaders
  (launcher/checkpoint/dcp.py); DCP reshards any split into the one full model.
- deepspeed: ZeRO stages 1-3 are merged into fp32 weights by DeepSpeed's own zero_to_fp32; stage
  0 keeps the whole module in its model-states file.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from launcher.checkpoint.files import ENGINE_DIR, Checkpoint, find_checkpoints, inspect
from launcher.config.load import load_config_file
from launcher.config.root import RootConfig
from launcher.errors import ConfigError, LauncherError
from launcher.models import build_model
from launcher.rundir import CONFIG_FILE
from launcher.serve.codec import Codec, codec_for

RUN_KEY = "RUN_DIR_OR_CHECKPOINT"


@dataclass
class LoadedRun:
    cfg: RootConfig
    model: nn.Module
    codec: Codec
    checkpoint: Checkpoint


def find_checkpoint(argument: str) -> tuple[Path, Checkpoint]:
    """(run directory, the checkpoint to load): the newest complete one of a run directory, or
    the checkpoints/step_<N> directory given."""
    path = Path(argument).expanduser().resolve()
    if not path.exists():
        raise ConfigError(RUN_KEY, f"{argument} does not exist.", "pass a run directory.")
    if (path / CONFIG_FILE).is_file():
        found = find_checkpoints(path)
        if not found:
            raise ConfigError(
                RUN_KEY,
                f"{path} holds no complete checkpoint (checkpoints/step_<N>).",
                "train it with checkpoint.enabled=true (the default) to the end, or pass "
                "another run.",
            )
        return path, found[0]
    checkpoint = inspect(path)
    run_dir = path.parent.parent
    if isinstance(checkpoint, str) or not (run_dir / CONFIG_FILE).is_file():
        why = checkpoint if isinstance(checkpoint, str) else f"no {CONFIG_FILE} in {run_dir}"
        raise ConfigError(
            RUN_KEY,
            f"{path} is neither a run directory (with {CONFIG_FILE}) nor a complete checkpoint "
            f"of one ({why}).",
            "pass a run directory or its checkpoints/step_<N>.",
        )
    return run_dir, checkpoint


def _load_dcp(model: nn.Module, directory: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from launcher.checkpoint.dcp import SafeLoadPlanner, SafeReader

    # The engines save {"model_optim": {"model": ..., "optim": ...}, ...}; read the model only.
    weights = model.state_dict()
    with warnings.catch_warnings():  # "no process group: loading in a single process" is the plan
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(
            {"model_optim": {"model": weights}},
            storage_reader=SafeReader(str(directory)),
            planner=SafeLoadPlanner(),
            no_dist=True,
        )
    model.load_state_dict(weights)


def _load_deepspeed(model: nn.Module, directory: Path, zero_stage: int) -> None:
    from launcher.engines.deepspeed import CHECKPOINT_TAG, _import_deepspeed

    _import_deepspeed(torch.device("cpu"))
    if zero_stage == 0:
        files = sorted((directory / CHECKPOINT_TAG).glob("mp_rank_*_model_states.pt"))
        if not files:
            raise FileNotFoundError(f"no model states under {directory / CHECKPOINT_TAG}")
        # DeepSpeed's own files hold its config objects: the same trust as resuming from them.
        state = torch.load(files[0], map_location="cpu", weights_only=False)["module"]
    else:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            state = get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=CHECKPOINT_TAG)
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in state.items()}, strict=False
    )
    loaded = {p.data_ptr() for k, p in model.state_dict().items() if k not in missing}
    # Tied weights (GPT's head is its embedding) are saved once.
    really_missing = [k for k in missing if model.state_dict()[k].data_ptr() not in loaded]
    if really_missing or unexpected:
        raise KeyError(f"missing {really_missing[:3]}, unexpected {unexpected[:3]}")


def load_run(argument: str, device: torch.device) -> LoadedRun:
    """The model (eval mode, fp32, on `device`) and tokenizer of a run's checkpoint."""
    run_dir, checkpoint = find_checkpoint(argument)
    cfg = load_config_file(run_dir / CONFIG_FILE)
    codec = codec_for(cfg.data)
    with torch.device("cpu"):
        model = build_model(cfg.model)
    engine = str(checkpoint.meta.get("engine", cfg.engine.name.value))
    directory = checkpoint.path / ENGINE_DIR
    try:
        if engine == "deepspeed":
            _load_deepspeed(model, directory, cfg.engine.zero_stage)
        else:
            _load_dcp(model, directory)
    except LauncherError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(
            RUN_KEY,
            f"the checkpoint {checkpoint.path} could not be loaded ({type(exc).__name__}: "
            f"{first}).",
            "pass another checkpoint of the run (checkpoints/step_<N>).",
        ) from None
    return LoadedRun(cfg, model.float().to(device).eval(), codec, checkpoint)
