"""What differs by engine is asked of the engine (issue 21): every registered spec plans its memory
parts and names its leaner variants, and reads its own checkpoints' weights into the plain model,
exactly the weights it trained, under the user's names and strictly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from launcher.checkpoint.checkpointer import Checkpointer
from launcher.checkpoint.files import find_checkpoints
from launcher.checkpoint.weights import load_strict, load_weights
from launcher.config.engine import EngineName
from launcher.distributed import DistContext, init_distributed, teardown_distributed
from launcher.engines import engine_spec
from launcher.models import build_model
from launcher.models.shape import STATE_PARTS, ModelShape
from tests.harness import build_trainer, make_config

# One engine per checkpoint reader: DCP (ddp and fsdp), DeepSpeed's model states (stage 0) and
# its ZeRO partitions merged by zero_to_fp32 (stages 1-3).
ENGINES = {
    "ddp": {"name": "ddp"},
    **{f"zero{s}": {"name": "deepspeed", "zero_stage": s} for s in (0, 3)},
}


@pytest.mark.parametrize("name", list(EngineName))
def test_every_engine_plans_its_memory_parts_and_variants(name: EngineName) -> None:
    engine: dict[str, Any] = {"name": name.value}
    cfg = make_config(engine=engine, parallel={"dp": 2}, batch={"global_size": 8})
    spec = engine_spec(name)
    shape = ModelShape(1000, 100, 8, 400, (400, 400, 100, 100))
    parts = spec.memory_parts(cfg, shape)
    assert tuple(parts) == STATE_PARTS and all(
        isinstance(n, int) and n >= 0 for n in parts.values()
    )
    for keys, variant in spec.leaner_variants(cfg):  # each a planned config, another engine's
        assert keys.startswith("engine") and variant.engine != cfg.engine
        assert engine_spec(variant.engine.name).memory_parts(variant, shape)["optimizer_state"]
    assert spec.short_name(cfg).startswith(name.value if spec.zero_stage(cfg) is None else "zero")


def test_engine_options_are_the_engines() -> None:
    zero3 = make_config(engine={"name": "deepspeed", "zero_stage": 3}, train={"precision": "bf16"})
    spec = engine_spec(EngineName.deepspeed)
    assert spec.short_name(zero3) == "zero3" and spec.casts_model(zero3)
    assert spec.leaner_variants(zero3) == [] and spec.shards_state(zero3)
    assert engine_spec(EngineName.fsdp).needs_blocks(zero3)
    assert engine_spec(EngineName.ddp).needs_blocks(zero3) is None


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight
        self.norm = nn.LayerNorm(3)


def test_weights_load_strictly_under_the_users_names() -> None:
    model = Tied()
    weights = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    del weights["head.weight"]  # a tied weight may be given once
    wrapped = {f"module._orig_mod.{k}": v for k, v in weights.items()}
    load_strict(model, wrapped)
    assert torch.equal(model.head.weight, weights["emb.weight"])
    assert torch.equal(model.norm.bias, weights["norm.bias"])
    with pytest.raises(KeyError, match=r"missing \['norm\.weight'"):
        load_strict(model, {k: v for k, v in weights.items() if k != "norm.weight"})
    with pytest.raises(KeyError, match=r"unexpected \['extra'"):
        load_strict(model, {**weights, "extra": torch.zeros(1)})


@pytest.fixture(autouse=True)
def _keep_torch_linear() -> Iterator[None]:
    """DeepSpeed's ZeRO-3 replaces torch.nn.functional.linear for the whole process (its
    memory-efficient linear "persists unless manually reset"); the tests after these, in the same
    process, count FLOPs and saved tensors of the plain one."""
    linear = torch.nn.functional.linear
    yield
    torch.nn.functional.linear = linear


@pytest.fixture
def ctx() -> Iterator[DistContext]:
    context = init_distributed("cpu")  # a one-rank gloo group in this process
    try:
        yield context
    finally:
        teardown_distributed()


def _full(value: torch.Tensor) -> torch.Tensor:
    return (value.full_tensor() if isinstance(value, DTensor) else value).detach().clone()


@pytest.mark.parametrize("name", list(ENGINES))
def test_each_engine_reads_back_the_weights_it_trained(
    name: str, ctx: DistContext, tmp_path: Path
) -> None:
    cfg = make_config(
        engine=ENGINES[name], train={"steps": 2}, batch={"global_size": 4, "micro_size": 2}
    )
    trainer = build_trainer(cfg, ctx, tmp_path)
    checkpoints = Checkpointer(cfg, tmp_path, ctx, trainer)
    for step in range(2):
        trainer.train_step(step)
    trainer.step = 2
    checkpoints.save_final()
    module = trainer.engine.module
    if name == "zero3":  # the parameters are partitioned: gather them to compare
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            trained = {k: _full(v) for k, v in module.state_dict().items()}
    else:
        trained = {k: _full(v) for k, v in module.state_dict().items()}

    plain = build_model(cfg.model)
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    load_weights(plain, find_checkpoints(tmp_path)[0], cfg)
    read = plain.state_dict()
    assert read.keys() == trained.keys()
    changed = [k for k in read if not torch.equal(read[k], before[k])]
    assert changed, "nothing was read"
    for key, value in trained.items():
        torch.testing.assert_close(read[key], value.float(), rtol=0, atol=0, msg=key)
