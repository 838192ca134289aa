"""Each engine's plan-time knowledge comes from its spec, found through the one registry: its
ZeRO stage, its files, its device checks, its checkpoint format, and the one precision map."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from launcher.checkpoint.compat import check_compatible, fingerprint
from launcher.config import to_root_config
from launcher.config.engine import EngineName
from launcher.config.root import RootConfig
from launcher.config.train import Precision
from launcher.engines import engine_spec, engine_spec_named
from launcher.engines import precision as precisions
from launcher.engines.base import Engine, TorchOptimizerEngine
from launcher.engines.ds_config import ds_config_json
from launcher.errors import ConfigError


def config(engine: dict[str, Any], **sections: dict[str, Any]) -> RootConfig:
    return to_root_config({"engine": engine, "wandb": {"mode": "disabled"}, **sections})


def test_every_engine_has_one_spec_under_its_name() -> None:
    for name in EngineName:
        assert engine_spec(name).name == name
        assert engine_spec_named(name.value) is engine_spec(name)
    assert engine_spec_named("megatron") is None


def test_only_deepspeed_has_a_zero_stage_and_a_file() -> None:
    for name in (EngineName.ddp, EngineName.fsdp):
        cfg = config({"name": name.value})
        assert engine_spec(name).zero_stage(cfg) is None
        assert engine_spec(name).extra_files(cfg) == {}
    cfg = config({"name": "deepspeed", "zero_stage": 3})
    spec = engine_spec(EngineName.deepspeed)
    assert spec.zero_stage(cfg) == 3
    assert spec.extra_files(cfg) == {"ds_config.json": ds_config_json(cfg)}


def test_device_checks_belong_to_the_engine() -> None:
    fp16 = {"precision": "fp16"}
    for name in (EngineName.ddp, EngineName.fsdp):
        engine_spec(name).check_environment(config({"name": name.value}, train=fp16), "cpu")
    ds = config({"name": "deepspeed"}, train=fp16)
    with pytest.raises(ConfigError) as info:
        engine_spec(EngineName.deepspeed).check_environment(ds, "cpu")
    assert info.value.keys == ["train.precision", "engine"]
    engine_spec(EngineName.deepspeed).check_environment(ds, "cuda")


def saved_meta(engine: str, world_size: int) -> dict[str, Any]:
    return {
        "fingerprint": fingerprint(to_root_config({})),
        "engine": engine,
        "world_size": world_size,
    }


def test_engines_sharing_a_format_read_each_others_checkpoints() -> None:
    cfg = config({"name": "fsdp"}, parallel={"dp": 2})
    check_compatible(saved_meta("ddp", 4), cfg, Path("ckpt"))  # DCP reshards: no error


@pytest.mark.parametrize(("saved", "now"), [("ddp", "deepspeed"), ("deepspeed", "fsdp")])
def test_another_format_is_refused(saved: str, now: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_compatible(saved_meta(saved, 1), config({"name": now}), Path("ckpt"))
    assert info.value.keys == ["engine"]
    assert "ddp and fsdp share a format, deepspeed has its own" in str(info.value)


def test_deepspeed_checkpoints_do_not_reshard() -> None:
    ds = {"name": "deepspeed"}
    check_compatible(saved_meta("deepspeed", 2), config(ds, parallel={"dp": 2}), Path("ckpt"))
    with pytest.raises(ConfigError) as info:
        check_compatible(saved_meta("deepspeed", 2), config(ds), Path("ckpt"))
    assert info.value.keys == ["parallel.dp"]
    assert "universal-checkpoint conversion" in str(info.value)
    assert "engine=ddp/fsdp" in str(info.value)


def test_one_precision_map() -> None:
    assert [precisions.bytes_per_element(p) for p in Precision] == [4, 2, 2]
    assert precisions.dtype(Precision.bf16) == torch.bfloat16
    assert precisions.reduced_dtype(Precision.fp32) is None
    assert precisions.reduced_dtype(Precision.fp16) == torch.float16
    assert [precisions.needs_loss_scaling(p) for p in Precision] == [False, False, True]
    cpu = torch.device("cpu")
    with precisions.autocast(Precision.bf16, cpu):
        assert torch.ones(2, 2).mm(torch.ones(2, 2)).dtype == torch.bfloat16
    with precisions.autocast(Precision.fp32, cpu):
        assert torch.ones(2, 2).mm(torch.ones(2, 2)).dtype == torch.float32


def test_the_loss_scaler_belongs_to_the_torch_optimizer_engines() -> None:
    """DeepSpeed scales the loss itself: the base interface promises no GradScaler."""
    assert "scaler" not in Engine.__annotations__
    assert "scaler" in TorchOptimizerEngine.__annotations__
