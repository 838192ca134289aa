"""engine.offload and parallel.replicate before launch: the refusals, the plan's device and host
bytes against the formulas of docs/memory.md, the generated ds_config.json, the plan's words, and
offload chosen by `auto` only when nothing else fits."""

from __future__ import annotations

from typing import Any

import pytest

from launcher.config import to_root_config
from launcher.config.ac import AcPolicy
from launcher.config.engine import Offload
from launcher.config.root import RootConfig
from launcher.engines import engine_spec
from launcher.engines.ds_config import build_ds_config
from launcher.engines.spec import with_offload as with_offload_
from launcher.errors import ConfigError
from launcher.memory.auto import choose, resolved
from launcher.memory.budget import Budget
from launcher.memory.parts import host_parts, state_parts
from launcher.memory.planner import Planner
from launcher.models.shape import ModelShape
from launcher.plan import model_info
from launcher.prepare import check_environment

P, BLOCK, N_BLOCKS = 1_000_000, 200_000, 4
SIZES = (500, 500, *(BLOCK,) * N_BLOCKS, P - 1000 - N_BLOCKS * BLOCK)
"""Two parameters under ZeRO-3's persistence threshold (kept whole), the rest sharded."""
SHAPE = ModelShape(P, BLOCK, N_BLOCKS, max(SIZES), SIZES)


def config(**sections: dict[str, Any]) -> RootConfig:
    base: dict[str, Any] = {
        "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 32},
        "batch": {"global_size": 16},
        "wandb": {"mode": "disabled"},
        **sections,
    }
    return to_root_config(base)


@pytest.mark.parametrize(
    ("sections", "keys"),
    [
        ({"engine": {"name": "ddp", "offload": "optimizer"}}, ["engine.offload"]),
        ({"engine": {"name": "fsdp", "offload": "optimizer"}}, ["engine.offload"]),
        (
            {"engine": {"name": "deepspeed", "offload": "optimizer"}},
            ["engine.offload", "engine.zero_stage"],
        ),
        (
            {"engine": {"name": "deepspeed", "zero_stage": 2, "offload": "params"}},
            ["engine.offload", "engine.zero_stage"],
        ),
        ({"parallel": {"dp": 4, "replicate": 2}}, ["parallel.replicate", "engine"]),
        (
            {"parallel": {"dp": 4, "replicate": 3}, "engine": {"name": "fsdp"}},
            ["parallel.replicate", "parallel.dp"],
        ),
        (
            {
                "engine": {
                    "name": "deepspeed",
                    "zero_stage": 2,
                    "extra": {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
                }
            },
            ["engine.extra.zero_optimization.offload_optimizer", "engine.offload"],
        ),
    ],
)
def test_bad_combinations_are_refused_naming_the_keys(
    sections: dict[str, Any], keys: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        cfg = config(**sections)
        build_ds_config(cfg)  # engine.extra is checked where ds_config.json is generated
    assert info.value.keys == keys and "Fix:" in str(info.value)


def test_fsdp_offload_is_refused_on_the_cpu_before_launch() -> None:
    cfg = config(engine={"name": "fsdp", "offload": "params"}, train={"device": "cpu"})
    with pytest.raises(ConfigError) as info:
        check_environment(cfg)
    assert info.value.keys == ["engine.offload", "train.device"]
    assert "Fix: drop engine.offload (engine.offload=none) here, or run on GPUs." in str(info.value)


def test_zero_offload_is_in_the_generated_ds_config() -> None:
    opt = build_ds_config(
        config(engine={"name": "deepspeed", "zero_stage": 2, "offload": "optimizer"})
    )
    assert opt["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    assert opt["zero_force_ds_cpu_optimizer"] is False  # our torch AdamW steps on the CPU
    params = build_ds_config(
        config(engine={"name": "deepspeed", "zero_stage": 3, "offload": "params"})
    )
    assert params["zero_optimization"]["offload_param"] == {"device": "cpu"}
    plain = build_ds_config(config(engine={"name": "deepspeed", "zero_stage": 2}))
    assert "offload_optimizer" not in plain["zero_optimization"]
    assert "zero_force_ds_cpu_optimizer" not in plain


def parts(**sections: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    cfg = config(**sections)
    return state_parts(cfg, SHAPE), host_parts(cfg, SHAPE)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_offload_moves_the_optimizer_partition_to_the_host(stage: int) -> None:
    """docs/memory.md: host = 4p/dp gradients + 8p/dp moments + 4p/dp master; the device keeps
    the model and the buckets."""
    engine = {"name": "deepspeed", "zero_stage": stage}
    dp = {"dp": 4}
    before, _ = parts(engine=engine, parallel=dp)
    device, host = parts(engine={**engine, "offload": "optimizer"}, parallel=dp)
    assert host == {"gradients": 4 * P // 4, "optimizer_state": 8 * P // 4, "precision_copies": P}
    assert device["gradients"] == device["optimizer_state"] == device["precision_copies"] == 0
    assert device["parameters"] == before["parameters"]
    assert device["comm_buffers"] == before["comm_buffers"]


def test_zero3_param_offload_keeps_only_the_persistent_parameters_on_the_device() -> None:
    engine = {"name": "deepspeed", "zero_stage": 3, "offload": "params"}
    device, host = parts(engine=engine, parallel={"dp": 4}, train={"precision": "bf16"})
    assert device["parameters"] == 1000 * 2  # the two small ones, whole, in bf16
    assert host["parameters"] == (P - 1000) * 2 // 4
    assert sum(host.values()) == (P - 1000) * 2 // 4 + 16 * P // 4


@pytest.mark.parametrize(("dp", "replicate"), [(4, 1), (4, 2), (8, 4)])
def test_hsdp_shards_the_state_over_dp_over_replicate(dp: int, replicate: int) -> None:
    """docs/memory.md: 4p/S parameters, 4p/S gradients, 8p/S moments with S = dp / replicate;
    offload=params moves all three to the host and leaves the gathered units on the device."""
    shard = dp // replicate
    parallel = {"dp": dp, "replicate": replicate}
    device, host = parts(engine={"name": "fsdp"}, parallel=parallel)
    assert (device["parameters"], device["gradients"]) == (4 * P // shard, 4 * P // shard)
    assert device["optimizer_state"] == 8 * P // shard and host == {}
    gathered = (P - N_BLOCKS * BLOCK + 2 * BLOCK) * 4 + (P - N_BLOCKS * BLOCK + BLOCK) * 4
    assert device["comm_buffers"] == gathered
    device, host = parts(engine={"name": "fsdp", "offload": "params"}, parallel=parallel)
    assert host == {
        "parameters": 4 * P // shard,
        "gradients": 4 * P // shard,
        "optimizer_state": 8 * P // shard,
    }
    assert sum(device.values()) == gathered


@pytest.mark.parametrize("offload", ["none", "params"])
def test_fsdp_accumulation_holds_the_whole_unsharded_gradient_on_the_device(offload: str) -> None:
    """docs/memory.md: with batch.grad_accum > 1 FSDP2 skips the reduce-scatter until the last
    micro-batch, so the device holds 4p of fp32 gradients, the host (offload) only the shards."""
    engine, parallel = {"name": "fsdp", "offload": offload}, {"dp": 4}
    one, _ = parts(engine=engine, parallel=parallel, batch={"global_size": 16, "grad_accum": 1})
    device, host = parts(
        engine=engine, parallel=parallel, batch={"global_size": 16, "grad_accum": 2}
    )
    assert device["gradients"] == 4 * P
    assert one["gradients"] == (0 if offload == "params" else 4 * P // 4)
    assert host.get("gradients", 0) == (4 * P // 4 if offload == "params" else 0)
    assert {k: v for k, v in device.items() if k != "gradients"} == {
        k: v for k, v in one.items() if k != "gradients"
    }


def test_auto_plans_each_micro_size_with_its_own_accumulation() -> None:
    """batch.micro_size=auto: the candidate of the whole per-rank batch does not accumulate, a
    smaller one does (and holds FSDP2's unsharded gradients)."""
    cfg = config(
        engine={"name": "fsdp"}, parallel={"dp": 2}, batch={"global_size": 16, "micro_size": "auto"}
    )
    info = model_info(cfg)
    assert info.blocks is not None
    shape = ModelShape(info.parameters, info.block_parameters, len(info.blocks), 0)
    planner = Planner(cfg, shape)
    p = info.parameters
    assert planner.plan(8, AcPolicy.none).parts["gradients"] == 4 * p // 2
    assert planner.plan(4, AcPolicy.none).parts["gradients"] == 4 * p


def slurm(dp: int, nodes: int, engine: str = "fsdp", **parallel: Any) -> RootConfig:
    return config(
        parallel={"dp": dp, "nodes": nodes, **parallel},
        engine={"name": engine},
        cluster={"name": "slurm"},
    )


def test_replicate_defaults_to_one_replica_per_node_and_the_plan_says_so() -> None:
    cfg = slurm(8, 2)
    assert cfg.replicas() == 2
    words = engine_spec(cfg.engine.name).describe(cfg)
    assert words == [
        "hybrid sharding (HSDP): state sharded over 4 ranks, replicated over 2 groups (the "
        "default on 2 nodes: one replica per node, so the all-gathers stay on a node's own links)"
    ]
    assert slurm(2, 2).replicas() == 1  # one rank per node: nothing to shard within a node
    assert slurm(8, 2, replicate=1).replicas() == 1  # asked for plain FSDP
    assert slurm(8, 2, engine="ddp").replicas() == 1
    assert config(parallel={"dp": 4}, engine={"name": "fsdp"}).replicas() == 1


def offload_planner(**engine: Any) -> Planner:
    cfg = config(
        engine={
            "name": "deepspeed",
            "zero_stage": 2,
            **engine,
            "extra": {"zero_optimization": {"reduce_bucket_size": 1000}},
        },
        batch={"global_size": 16, "micro_size": "auto"},
        train={"device": "cuda"},
    )
    info = model_info(cfg)
    assert info.blocks is not None
    big = ModelShape(10**8, info.block_parameters, len(info.blocks), 0)  # state dominates
    return Planner(cfg, big)


def test_auto_offloads_only_when_nothing_else_fits() -> None:
    p = offload_planner()
    smallest_without = p.plan(1, AcPolicy.none).peak
    with_offload = p.plan(1, AcPolicy.none, with_offload_(p.cfg, Offload.optimizer))
    assert with_offload.peak < smallest_without
    roomy = choose(p, Budget(int(p.plan(16, AcPolicy.none).peak / 0.85), "test"))
    assert roomy.variant is None and "offload" not in roomy.reason
    tight = choose(p, Budget(int(with_offload.peak / 0.85), "test"))
    assert tight.variant is not None
    assert "nothing fits on the device without offload, so engine.offload=optimizer" in tight.reason
    run = resolved(p.cfg, tight)
    assert run.engine.offload.value == "optimizer" and run.split().global_size == 16
