"""The built-in GPT's tensor-parallel plan (torch.distributed.tensor.parallel).

Megatron's split, as torchtitan applies it to Llama: in each block the attention's fused qkv
and the MLP's fc are column-parallel (each rank computes whole heads of q, k and v: the model
groups qkv's rows by head, so Shard(0) of the weight is whole heads), the two output projections
row-parallel (a partial sum reduced once per region). The embeddings and the tied head are split
by vocabulary rows; the head gathers its logits (Replicate), so the loss is the one
token_loss_sum of one process. With sequence parallelism the residual stream between the
regions is sharded on the sequence: the norms and dropout run on a shard, the column-parallel
inputs all-gather and the row-parallel outputs reduce-scatter instead of all-reducing.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def gpt_plan(sequence_parallel: bool) -> dict[str, Any]:
    """Module name (fnmatch pattern) -> parallel style for parallelize_module."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    stream = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=stream),
        "blocks.*.attn.qkv": ColwiseParallel(input_layouts=stream),
        "blocks.*.attn.proj": RowwiseParallel(output_layouts=stream),
        "blocks.*.mlp.fc": ColwiseParallel(input_layouts=stream),
        "blocks.*.mlp.proj": RowwiseParallel(output_layouts=stream),
        "head": ColwiseParallel(input_layouts=stream, output_layouts=Replicate()),
    }
    if sequence_parallel:
        # Positions are the sequence: each rank adds its shard's rows to its token shard.
        plan["pos_emb"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
        for norm in ("blocks.*.ln_1", "blocks.*.ln_2", "ln_f"):
            plan[norm] = SequenceParallel()
    return plan


def _tied(model: nn.Module) -> tuple[nn.Linear, nn.Embedding] | None:
    """(head, embedding) when this module holds both and they share one weight."""
    head, emb = getattr(model, "head", None), getattr(model, "tok_emb", None)
    if isinstance(head, nn.Linear) and isinstance(emb, nn.Embedding) and head.weight is emb.weight:
        return head, emb
    return None


def parallelize_gpt(model: nn.Module, mesh: Any, sequence_parallel: bool) -> nn.Module:
    """Split the GPT, or a pipeline rank's stages of it (RankStages: the GPT's names, only its
    parts), over the mesh's tp dimension in place; the plan's entries for parts a stage does not
    hold are left out. The tied embedding and head share one DTensor again afterwards (both are
    Shard(0) of the same rows); under pp they sit on different ranks, each Shard(0) alike."""
    from torch.distributed.tensor.parallel import parallelize_module

    tied = _tied(model)
    plan = gpt_plan(sequence_parallel)
    held = {k: v for k, v in plan.items() if hasattr(model, k.split(".")[0])}
    parallelize_module(model, mesh, held)
    if tied is not None:
        head, emb = tied
        head.weight = emb.weight
    return model
