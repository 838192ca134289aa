"""`train.compile=true`: each of the model's repeated blocks compiled in place.

Per block, as torchtitan, Lightning and the HF Trainer do: recompute policies and FSDP2 act on
the block list, and each block stays the same module of the model. `Module.compile()` compiles
the block's call in place instead of wrapping it in an OptimizedModule, so parameter names,
state_dict keys and checkpoints are the eager model's (no `_orig_mod.`): a compiled run resumes
an eager run's checkpoint and the other way round. The blocks share one code object, so one
compilation serves every block of the same shapes.

Compilation is lazy: the first step pays it (forward, then backward); `compile_seconds` reads
what dynamo and inductor spent so far, for the progress line and summary.json. Dynamo does not
trace under a TorchDispatchMode: `ac=selective` (whose op policy is one) leaves the blocks eager,
and the CPU peak meter's first steps (launcher/memory/peak.py) run eagerly for that reason
(EagerWhileMeasured): on the CPU the first compiled step follows the measured window.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from launcher.config.ac import AcConfig, AcPolicy
from launcher.errors import ConfigError
from launcher.logs import get_logger
from launcher.memory.peak import PeakMeter
from launcher.models.blocks import require_blocks

log = get_logger("compile")


def compile_blocks(model: nn.Module, ac: AcConfig, blocks_path: str | None = None) -> int:
    """Compile each block of the model's block list in place; the number compiled."""
    found = require_blocks(model, blocks_path, "train.compile=true (compiled per block)")
    if ac.policy == AcPolicy.selective:
        # Its op policy runs each block under a TorchDispatchMode, which dynamo cannot trace.
        log.warning(
            "train.compile=true with ac=selective: the blocks run eagerly (the selective op "
            "policy cannot be compiled); ac=full or ac=none compile them."
        )
        return 0
    for block in found.blocks:
        # Training shapes are fixed, so the first graph is static; dynamo's default makes the
        # graph dynamic on the first shape change (a validation batch) instead of compiling
        # one graph per shape, as dynamic=False would.
        block.compile()
    log.info(f"compile: the {len(found)} blocks at {found.path} compile when they first run")
    return len(found)


def compile_seconds() -> float:
    """Seconds spent compiling in this process so far (forward and backward graphs)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))


@contextmanager
def eager() -> Iterator[None]:
    """Compiled blocks run eagerly inside (generation: a new shape every decoding step)."""
    with torch.compiler.set_stance("force_eager"):
        yield


class EagerWhileMeasured:
    """A step callback (after the meter): compiled blocks run eagerly while the CPU peak meter's
    TorchDispatchMode is on. Dynamo does not trace under such a mode, and a block first called
    under it would never be compiled afterwards either."""

    def __init__(self, meter: PeakMeter) -> None:
        self.meter = meter
        self.eager = False

    def _measuring(self) -> bool:
        """The meter's window is open, or opens at this step (it precedes this callback)."""
        return self.meter.device.type == "cpu" and self.meter.peak_bytes is None

    def before_step(self, step: int) -> None:
        del step
        if self._measuring() and not self.eager:
            torch.compiler.set_stance("force_eager")
            self.eager = True

    def after_step(self, step: int) -> None:
        del step
        if self.eager and not self._measuring():
            torch.compiler.set_stance("default")
            self.eager = False


def _first_line(exc: BaseException) -> str:
    """The inner error's first line: inductor's message carries whole generated sources."""
    inner = getattr(exc, "inner_exception", None) or exc.__cause__ or exc
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0] if lines else ''}".strip()


@contextmanager
def compile_errors(enabled: bool) -> Iterator[None]:
    """A model that fails to compile: one ConfigError naming train.compile, no inductor page."""
    if not enabled:
        yield
        return
    from torch._dynamo.exc import TorchDynamoException

    try:
        yield
    except TorchDynamoException as exc:
        raise ConfigError(
            "train.compile",
            f"the model failed to compile ({_first_line(exc)[:300]}).",
            "set train.compile=false (the default) to train eagerly; TORCHDYNAMO_VERBOSE=1 "
            "shows where compiling fails.",
        ) from None
