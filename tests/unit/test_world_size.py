"""The runtime layer of validation: the job has the ranks the config asks for."""

from __future__ import annotations

import pytest


def test_world_size_must_match_the_config() -> None:
    import torch

    from launcher.distributed import DistContext, check_world_size
    from launcher.errors import ConfigError

    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    check_world_size(ctx, dp=1, nodes=1)
    with pytest.raises(ConfigError) as info:
        check_world_size(ctx, dp=4, nodes=2)
    assert info.value.keys == ["parallel.dp", "parallel.nodes"] and "1 rank(s)" in str(info.value)


@pytest.mark.parametrize(
    ("gpus", "batch", "fix"),
    [
        (3, {"global_size": 32}, "parallel.dp=2"),  # 3 ranks would not split 32 sequences
        (3, {"global_size": 48, "micro_size": 4}, "parallel.dp=3"),
        (3, {"global_size": 16, "micro_size": 4}, "parallel.dp=2"),  # 3 x 4 does not divide 16
    ],
)
def test_more_ranks_than_gpus_offers_a_dp_that_fits_and_splits(
    gpus: int, batch: dict[str, int], fix: str
) -> None:
    """Issue 33: "set parallel.dp<=0" was offered on a machine without a GPU; the fix is now a
    dp this machine holds that also splits the global batch, or the CPU, or a SLURM job."""
    from launcher.config import to_root_config
    from launcher.runners.local import too_few_gpus

    cfg = to_root_config({"parallel": {"dp": 4}, "batch": batch, "train": {"device": "cuda"}})
    text = str(too_few_gpus(cfg, gpus))
    assert f"Fix: use the {gpus} GPU(s) here with {fix}, or train on the CPU here with " in text
    assert "cluster=slurm cluster.gpus_per_node=4." in text
    dp = int(fix.split("=")[1])
    to_root_config({"parallel": {"dp": dp}, "batch": batch}).split()  # the fix splits the batch
    none = str(too_few_gpus(cfg, 0))
    assert "torch sees no GPU" in none and "parallel.dp=" not in none
