"""`launch verify`'s ranks (launcher/verify/rank.py) under the sharded engines in two real gloo
ranks: the full gradients they gather (FSDP2's DTensor shards, ZeRO 2's and ZeRO 3's partitions)
match the one-process reference to fp32 rounding, so the split is certified.

One spawned group runs every case in turn (one process start, not one per case); the reference
(dp 1, one micro-batch of the whole global batch) is the same for all and runs here.
"""

from __future__ import annotations

import gc
import importlib.util
import traceback
from pathlib import Path

import pytest
import torch.distributed as dist

from launcher.config import to_root_config
from launcher.config.root import RootConfig
from launcher.verify.compare import compare
from launcher.verify.rank import run_verify_rank, verify_rank
from launcher.verify.results import read_result
from launcher.verify.settings import TOLERANCES, reference_config, split_config
from tests.harness import free_port, join_group
from tests.spawned import run_ranks

pytestmark = pytest.mark.multiproc

# (engine, zero stage, grad_accum, recompute): the sharded engines at dp=2, each gathering its
# gradients its own way (ZeRO 1 gathers as ZeRO 2 does). DDP at dp=2 with ac=full runs through
# the CLI in tests/e2e/test_verify.py; every engine x granularity pair: scripts/verify_grid.py.
CASES = [
    ("fsdp", 0, 2, "every_n"),
    ("deepspeed", 2, 1, "sqrt"),
    ("deepspeed", 3, 2, "selective"),
]


def _config(engine: str, stage: int, accum: int, ac: str) -> RootConfig:
    return split_config(
        to_root_config(
            {
                "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 24},
                "batch": {"global_size": 8, "grad_accum": accum},
                "parallel": {"dp": 2},
                "engine": {"name": engine, "zero_stage": stage},
                "ac": {"policy": ac},
                "optim": {"warmup_steps": 0},
                "wandb": {"mode": "disabled"},
            }
        )
    )


def _name(case: tuple[str, int, int, str]) -> str:
    engine, stage, accum, ac = case
    return f"{engine}{stage if engine == 'deepspeed' else ''}-acc{accum}-{ac}"


def _group(rank: int, port: int, out: str) -> None:
    ctx = join_group(rank, 2, port)
    try:
        for case in CASES:
            run = Path(out) / _name(case)
            if rank == 0:
                run.mkdir(parents=True, exist_ok=True)
            dist.barrier()
            try:
                verify_rank(_config(*case), run, ctx)
            except BaseException:
                (run / f"error{rank}.txt").write_text(traceback.format_exc())
                raise
            finally:
                gc.collect()
    finally:
        gc.collect()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("verify_engines")
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    run_ranks(_group, (free_port(), str(out)), 2)
    reference = out / "reference"
    reference.mkdir()
    assert run_verify_rank(reference_config(_config(*CASES[0])), reference) == 0
    return out


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_sharded_engines_are_certified_at_dp2(runs: Path, case: tuple[str, int, int, str]) -> None:
    result = read_result(runs / _name(case))
    reference = read_result(runs / "reference")
    comparison = compare(result, reference, TOLERANCES["fp32"])
    assert len(comparison.param_gaps) == len(reference.grads) > 0
    assert comparison.certified, (comparison.loss_gaps, comparison.worst_param)


def test_the_reference_is_one_big_batch(runs: Path) -> None:
    reference = read_result(runs / "reference")
    assert reference.split == {"global_size": 8, "micro_size": 8, "grad_accum": 1, "dp": 1}
    assert len(reference.steps) == 3 and all(s.loss is not None for s in reference.steps)
