"""DeepSpeed: ZeRO stages 0-3 around torch's AdamW and our warmup-cosine schedule.

Imported only when engine=deepspeed (DeepSpeed's import is slow and pulls in much).

How the token-exact loss survives DeepSpeed:
- backward(scale_wrt_gas=False): DeepSpeed would otherwise divide every micro-batch's loss by
  gradient_accumulation_steps; our loss is already the global token mean.
- DeepSpeed averages gradients over the data-parallel ranks at every ZeRO stage, so
  grad_divisor = world size, as for DDP.
- accumulation_context(sync) sets DeepSpeed's accumulation boundary explicitly: it reduces
  (stage 0/1) or finishes its partitioned reduction (stage 2/3) on the last micro-batch, and the
  loop calls step() once per optimizer step.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from launcher.config.root import RootConfig
from launcher.distributed import DistContext
from launcher.engines.base import Engine
from launcher.engines.ds_config import build_ds_config
from launcher.engines.optim import build_optimizer, build_scheduler

CHECKPOINT_TAG = "deepspeed"


class _DropExpected(logging.Filter):
    """DeepSpeed warns about any client optimizer it did not write; ours is chosen on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "untested optimizer" not in record.getMessage()


_DROP_EXPECTED = _DropExpected()


def import_deepspeed(device: torch.device) -> Any:
    # DeepSpeed picks its accelerator at import: make it the device this rank trains on (a
    # GPU machine with train.device=cpu must not get the CUDA accelerator), which also silences
    # its "Setting accelerator to CPU" guess.
    os.environ["DS_ACCELERATOR"] = device.type
    import deepspeed

    compatible = getattr(getattr(deepspeed, "ops", None), "__compatible_ops__", None)
    if device.type == "cpu" and isinstance(compatible, dict):
        # DeepSpeed's comm backend JIT-compiles a shared-memory op for the CPU accelerator on its
        # first multi-rank run (30 s of two cores, and a C++ compiler), used only by its inference
        # all-reduce: training's collectives are torch.distributed's. Marked unusable, it is
        # skipped (DeepSpeed keeps this dict for the process, edits included; a release without
        # it builds the op as before).
        compatible["deepspeed_shm_comm"] = False
    ds_logger = logging.getLogger("DeepSpeed")
    ds_logger.setLevel(logging.WARNING)  # it logs its whole config at INFO on every rank
    ds_logger.addFilter(_DROP_EXPECTED)  # once, however many engines this process builds
    # DeepSpeed still calls collectives under names torch has deprecated: not ours to fix.
    warnings.filterwarnings(
        "ignore", category=FutureWarning, module="torch.distributed.c10d_logger"
    )
    return deepspeed


def preload_deepspeed() -> None:
    """DeepSpeed imported in `launch` before its ranks are forked from it (they inherit the
    import). Ranks are forked on CPU-only machines alone (launcher/runners/rank_fork.py): the
    accelerator is the CPU's. The variables the import sets are put back (torchrun has copied
    this environment for the first rank already; each rank sets them itself), and a failed import
    is the ranks' to report, as it would be without this."""
    before = dict(os.environ)
    try:
        import_deepspeed(torch.device("cpu"))
    except Exception:
        pass
    finally:
        for key in [k for k in os.environ if k not in before]:
            del os.environ[key]
        os.environ.update(before)


class DeepSpeedEngine(Engine):
    def __init__(self, cfg: RootConfig, model: nn.Module, ctx: DistContext) -> None:
        super().__init__(cfg)
        deepspeed = import_deepspeed(ctx.device)
        # DeepSpeed insists on LOCAL_RANK, which torchrun sets; the in-process one-rank run
        # (dp=1) has none. (Not RANK/WORLD_SIZE: they would mark this process as a torchrun rank.)
        os.environ.setdefault("LOCAL_RANK", str(ctx.local_rank))
        self.ds_config = build_ds_config(cfg)
        self.module = model.to(ctx.device)
        self._frozen = any(not p.requires_grad for p in self.module.parameters())
        # The client optimizer and scheduler are the ones ddp and fsdp use: the same numbers
        # (the optimizer holds the trainable parameters only: an adapter run's base is frozen).
        self.optimizer = build_optimizer(self.module, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.train.steps, cfg.optim)
        # Other ranks speak only on error: DeepSpeed print()s progress while it sets up comms.
        quiet = nullcontext() if ctx.is_main else contextlib.redirect_stdout(io.StringIO())
        with quiet:
            # The process group exists already (torchrun's env:// or the in-process one-rank group).
            self.ds, _, _, _ = deepspeed.initialize(
                model=self.module,
                optimizer=self.optimizer,
                lr_scheduler=self.scheduler,
                config=self.ds_config,
                dist_init_required=False,
            )
        self.model: nn.Module = self.ds
        self.grad_divisor = float(ctx.world_size)
        # ZeRO and the mixed-precision wrappers report the global norm; a bare torch optimizer
        # (stage 0 in fp32) does not, so then we measure the (already all-reduced) gradients.
        self._measure_norm = not hasattr(self.ds.optimizer, "_global_grad_norm")

    @contextmanager
    def _boundary(self, sync: bool) -> Iterator[None]:
        self.ds.set_gradient_accumulation_boundary(sync)
        yield

    def accumulation_context(self, sync: bool) -> AbstractContextManager[Any]:
        return self._boundary(sync)

    def autocast(self) -> AbstractContextManager[Any]:
        return nullcontext()  # DeepSpeed casts the model to bf16/fp16 itself (fp32: nothing to do)

    def backward(self, loss: torch.Tensor) -> None:
        self.ds.backward(loss, scale_wrt_gas=False)

    def step(self) -> torch.Tensor:
        """Unscale, clip (gradient_clipping), step optimizer and scheduler, zero the gradients.

        The norm is a tensor; DeepSpeed itself may sync on the host inside ds.step() (overflow
        checks, its own norm), which is not ours to remove."""
        measured = self._grad_norm() if self._measure_norm else None
        self.ds.step()
        norm = measured if measured is not None else self.ds.get_global_grad_norm()
        if isinstance(norm, torch.Tensor):
            return norm.detach()
        return torch.tensor(math.nan if norm is None else float(norm), dtype=torch.float64)

    def _grad_norm(self) -> torch.Tensor:
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros((), dtype=torch.float64)
        return torch.nn.utils.get_total_norm(grads).detach()

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def full_gradient(self, param: nn.Parameter) -> torch.Tensor:
        """ZeRO 1-3 keep gradients in the optimizer's partitions (and ZeRO-3 the parameter
        itself): DeepSpeed assembles the fp32 gradient; stage 0 in fp32 leaves it in `p.grad`."""
        from deepspeed.utils import safe_get_full_grad  # imported already: this engine built it

        partitioned = any(hasattr(param, a) for a in ("ds_id", "_hp_mapping", "_hp_grad"))
        grad = safe_get_full_grad(param) if partitioned else param.grad
        if grad is None:
            return torch.zeros(tuple(getattr(param, "ds_shape", param.shape)))
        return grad

    def save_checkpoint(self, directory: Path, client_state: dict[str, Any]) -> None:
        """Collective: DeepSpeed's own checkpoint (model, ZeRO partitions, scheduler, scaler)."""
        self.ds.save_checkpoint(
            str(directory),
            tag=CHECKPOINT_TAG,
            client_state=client_state,
            # An adapter run's frozen base is rebuilt from its source, never saved.
            exclude_frozen_parameters=self._frozen,
        )

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        """Collective: restore what save_checkpoint wrote; return its client_state."""
        path, client_state = self.ds.load_checkpoint(
            str(directory),
            tag=CHECKPOINT_TAG,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
            load_module_strict=not self._frozen,  # the frozen base is not in the checkpoint
        )
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}")
        return dict(client_state or {})


def read_weights(directory: Path, zero_stage: int) -> dict[str, torch.Tensor]:
    """The fp32 model weights of a checkpoint written by save_checkpoint, in one process: ZeRO
    stages 1-3 merged by DeepSpeed's own zero_to_fp32; stage 0 keeps the whole module in its
    model-states file. A weight tied to another is saved once."""
    import_deepspeed(torch.device("cpu"))
    if zero_stage == 0:
        files = sorted((directory / CHECKPOINT_TAG).glob("mp_rank_*_model_states.pt"))
        if not files:
            raise FileNotFoundError(f"no model states under {directory / CHECKPOINT_TAG}")
        # DeepSpeed's own files hold its config objects: the same trust as resuming from them.
        state = torch.load(files[0], map_location="cpu", weights_only=False)["module"]
    else:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            state = get_fp32_state_dict_from_zero_checkpoint(
                str(directory), tag=CHECKPOINT_TAG, exclude_frozen_parameters=True
            )
    return {name: value.float() for name, value in state.items()}
