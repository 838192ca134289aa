"""torch.distributed.checkpoint (DCP) for the engines that use it (ddp, fsdp), loaded safely.

DCP writes one file per rank plus a `.metadata` index, and reshards on load: a checkpoint saved
by 2 ranks loads into 1 or 4. Two parts of stock DCP loading would unpickle arbitrary objects
(the `.metadata` file and non-tensor values such as learning rates); here both go through
restricted loaders, so loading a checkpoint never runs code from it.
"""

from __future__ import annotations

import io
import logging
import pickle
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from launcher.adapters.apply import frozen_names
from launcher.models.names import plain_name
from launcher.parallel.pipeline_split import optimizer_aliases

# What a DCP `.metadata` file may name: DCP's own index records, torch sizes, dtypes and layouts.
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"checkpoint metadata names {module}.{name}, which is not allowed"
        )


class SafeReader(dcp.FileSystemReader):
    """FileSystemReader whose `.metadata` is unpickled with an allow-list of DCP's own classes."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        with open(Path(self.path) / name, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{self.path}/{name} is not DCP metadata")
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (learning rates, step counts, betas) are loaded with weights_only=True."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            # Same placement as the parent class, without its unrestricted unpickling.
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _plain(name: str) -> str:
    """A parameter's name as DCP's state_dict helpers give it: no wrapper infixes, no DDP
    `module.` prefix."""
    name = plain_name(name)
    return name.removeprefix("module.")


MODEL_AND_OPTIMIZER = "model_optim"
"""The key of ModelAndOptimizer in the engines' DCP state (engines/base.py)."""


class ModelAndOptimizer(Stateful):
    """Model and optimizer state through DCP's state_dict helpers, which understand DDP and FSDP
    wrappers and shard the optimizer state like the parameters."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        frozen = self._frozen()  # an adapter run saves what trains, not its frozen base
        model_state = {k: v for k, v in model_state.items() if k not in frozen}
        aliases = optimizer_aliases(self.model)  # a pipeline's copy of a tied weight
        return {"model": model_state, "optim": _renamed(optim_state, aliases)}

    def _frozen(self) -> set[str]:
        return {_plain(n) for n in frozen_names(self.model)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        back = {name: alias for alias, name in optimizer_aliases(self.model).items()}
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=_renamed(state_dict["optim"], back),
            options=StateDictOptions(strict=not self._frozen()),
        )


def _renamed(optim_state: Any, aliases: dict[str, str]) -> Any:
    """An optimizer state dict (per-name state, per-group name lists) with names replaced."""
    if not aliases:
        return optim_state
    return {
        "state": {aliases.get(k, k): v for k, v in optim_state["state"].items()},
        "param_groups": [
            {**group, "params": [aliases.get(n, n) for n in group["params"]]}
            for group in optim_state["param_groups"]
        ],
    }


def save(directory: Path, state: dict[str, Any]) -> None:
    """Collective: every rank writes its shard of `state` (Stateful values are asked for theirs)."""
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(directory), sync_files=True))


def save_async(directory: Path, state: dict[str, Any], group: dist.ProcessGroup) -> Future[Any]:
    """Collective: copy this rank's shard of `state` to host memory now (the writer's staging),
    then write it from DCP's background thread; the future ends when this rank's files and, on
    the coordinator, `.metadata` are written. `group` must be a gloo group of its own: the
    writer's collectives run while training uses the default group."""
    writer = dcp.FileSystemWriter(str(directory), sync_files=True)
    started = dcp.async_save(state, storage_writer=writer, process_group=group)
    # With the writer as the stager, staging is done on return and the answer is a plain Future.
    return started if isinstance(started, Future) else started.upload_completion


def load(directory: Path, state: dict[str, Any]) -> None:
    """Collective: fill `state` in place (Stateful values get load_state_dict), resharding as
    needed.

    DCP logs a damaged file's tracebacks to the root logger as warnings before it raises; the
    caller reports the failure in one line, so they are held back here."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        dcp.load(state, storage_reader=SafeReader(str(directory)), planner=SafeLoadPlanner())
    finally:
        root.setLevel(level)


def read_model_weights(directory: Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint that holds a ModelAndOptimizer, read in one process
    without a process group (DCP reshards any dp into the one full model); `model` gives the names
    and shapes and is left unchanged."""
    frozen = frozen_names(model)  # an adapter run's base: not in its checkpoints
    weights = {
        name: torch.empty_like(value)
        for name, value in model.state_dict().items()
        if name not in frozen
    }
    with warnings.catch_warnings():  # "no process group: loading in a single process" is the plan
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(
            {MODEL_AND_OPTIMIZER: {"model": weights}},
            storage_reader=SafeReader(str(directory)),
            planner=SafeLoadPlanner(),
            no_dist=True,
        )
    return weights
