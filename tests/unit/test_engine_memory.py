"""The plan's per-rank state memory follows what each engine shards."""

from __future__ import annotations

import pytest

from launcher.config import to_root_config
from launcher.engines import engine_spec

P = 1_000_000  # parameters
DP = 4


def per_rank(engine: dict, precision: str = "fp32") -> dict[str, int]:
    cfg = to_root_config(
        {
            "engine": engine,
            "parallel": {"dp": DP},
            "train": {"precision": precision},
            "wandb": {"mode": "disabled"},
        }
    )
    return engine_spec(cfg.engine.name).state_bytes(cfg, P)


def test_ddp_replicates_everything() -> None:
    assert per_rank({"name": "ddp"}) == {
        "parameters": 4 * P,
        "gradients": 4 * P,
        "optimizer": 8 * P,
    }
    # autocast keeps fp32 parameters: bf16 changes nothing here
    assert per_rank({"name": "ddp"}, "bf16") == per_rank({"name": "ddp"})


def test_fsdp_shards_everything() -> None:
    assert per_rank({"name": "fsdp"}) == {"parameters": P, "gradients": P, "optimizer": 2 * P}


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        (0, {"parameters": 2 * P, "gradients": 2 * P, "optimizer": 12 * P}),
        (1, {"parameters": 2 * P, "gradients": 2 * P, "optimizer": 3 * P}),
        (2, {"parameters": 2 * P, "gradients": P // 2, "optimizer": 3 * P}),
        (3, {"parameters": P // 2, "gradients": P // 2, "optimizer": 3 * P}),
    ],
)
def test_zero_stages_in_bf16(stage: int, expected: dict[str, int]) -> None:
    """The ZeRO paper's 2 + 2 + 12 bytes per parameter, sharded stage by stage."""
    assert per_rank({"name": "deepspeed", "zero_stage": stage}, "bf16") == expected


def test_zero_in_fp32_has_no_master_copy() -> None:
    assert per_rank({"name": "deepspeed", "zero_stage": 0}) == per_rank({"name": "ddp"})
