"""parallel.tp inside pipeline stages (the 3-D mesh): accepted before launch, each rank knows its
(pp, dp, tp) place and only one rank per data-parallel stream counts tokens, and `launch plan`
prints the 3-D mesh with a stage's share of the model divided by tp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose

from launcher.config import to_root_config
from launcher.distributed import DistContext
from tests.helpers import run_launch

TINY = ["model.n_head=4", "model.d_model=32", "model.seq_len=24", "batch.global_size=8"]
THREE_D = ["parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "batch.grad_accum=2"]


def test_tp_inside_pipeline_stages_is_accepted(hydra_conf: None) -> None:
    overrides = [*TINY, "model.n_layer=2", *THREE_D, "engine=fsdp"]
    cfg = to_root_config(compose(config_name="config", overrides=overrides))
    assert (cfg.parallel.world, cfg.split().dp, cfg.parallel.sequence_sharded) == (8, 2, True)


def test_a_3d_rank_knows_its_place_and_one_rank_per_stream_counts_tokens() -> None:
    cpu = pytest.importorskip("torch").device("cpu")
    # rank = (pp_rank x dp + dp_rank) x tp + tp_rank: tp innermost, pp outermost
    places = [DistContext(r, 8, r, cpu, tp=2, pp=2) for r in range(8)]
    assert [(c.pp_rank, c.dp_rank, c.tp_rank) for c in places] == [
        (p, d, t) for p in range(2) for d in range(2) for t in range(2)
    ]
    assert [c.rank for c in places if c.counts_tokens] == [4, 6]  # last stage, tp rank 0


def test_launch_plan_prints_the_3d_mesh_and_divides_a_stage_by_tp(tmp_path: Path) -> None:
    args = ["plan", *TINY, "model.n_layer=4", "wandb.mode=disabled"]  # engine=ddp: no dp shards
    run_launch([*args, "parallel.pp=2", "batch.grad_accum=2"], tmp_path / "pp")
    proc = run_launch([*args, *THREE_D], tmp_path / "3d")
    pp_ranks = json.loads((tmp_path / "pp" / "plan.json").read_text())["pipeline"]["ranks"]
    plan = json.loads((tmp_path / "3d" / "plan.json").read_text())
    assert (plan["world_size"], plan["dp"], plan["tp"], plan["pp"]) == (8, 2, 2, 2)
    assert [s["blocks"] for s in plan["pipeline"]["stages"]] == [[0, 1], [2, 3]]
    # Each pp rank's share with every split layer halved (the embeddings too, sequence parallel):
    # kept whole are each block's two norms and two row-parallel biases (6 d, 2 blocks per stage)
    # and, on the last stage's rank, the final norm (2 d), fp32.
    d = 32
    kept = [2 * 6 * d, 2 * 6 * d + 2 * d]
    shares = [r["parameters"] for r in plan["pipeline"]["ranks"]]
    assert shares == [(r["parameters"] - k) // 2 + k for r, k in zip(pp_ranks, kept, strict=True)]
    peak = next(r for r in plan["pipeline"]["ranks"] if r.get("peak"))
    assert plan["memory_plan"]["parts"]["parameters"] == 4 * peak["parameters"]
    assert (
        "mesh        (pp 2, dp 2, tp 2): 2 consecutive ranks per tensor-parallel group, "
        "sequence parallel, 4 ranks per pipeline stage" in proc.stdout
    )
    assert "pipeline    pp 2, schedule 1f1b, 2 micro-batch(es) per step" in proc.stdout
