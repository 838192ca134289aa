"""What the memory plan knows about a model, and the names of the plan's parts: what every
engine's `EngineSpec.memory_parts` (launcher/engines/) reads and returns. Imports nothing of the
plan, so the engines can use it without the plan importing them back."""

from __future__ import annotations

from dataclasses import dataclass

FP32 = 4
STATE_PARTS = ("parameters", "gradients", "optimizer_state", "precision_copies", "comm_buffers")
"""The parts an engine plans (everything but the activations), in the order they are shown."""


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs to know about the model (from launcher/models/probe.py)."""

    parameters: int
    block_parameters: int
    """One repeated block's parameters (FSDP2 gathers one unit at a time)."""
    n_blocks: int
    largest_parameter: int
    parameter_sizes: tuple[int, ...] = ()
    """Elements of each parameter (ZeRO-3 keeps those under its persistence threshold whole)."""
    trainable: int | None = None
    """Parameters with gradients and optimizer state (an adapter run's); None: all of them."""
    block_trainable: int | None = None
    """The same for one repeated block."""

    @property
    def trained(self) -> int:
        """Parameters that get gradients and optimizer state (a frozen base gets neither)."""
        return self.parameters if self.trainable is None else self.trainable

    @property
    def block_trained(self) -> int:
        return self.block_parameters if self.block_trainable is None else self.block_trainable
