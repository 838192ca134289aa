"""parallel.min_nodes: validated where defined; the split on fewer nodes keeps the global batch
and the micro-batch; a range with a size that cannot hold them is refused naming it."""

from __future__ import annotations

import pytest

from launcher.config.cluster import ClusterConfig, ClusterKind
from launcher.config.parallel import BatchConfig, ParallelConfig
from launcher.config.root import RootConfig
from launcher.config.train import TrainConfig
from launcher.errors import ConfigError


def elastic(dp: int, nodes: int, min_nodes: int, global_size: int, micro: int) -> RootConfig:
    return RootConfig(
        parallel=ParallelConfig(dp=dp, nodes=nodes, min_nodes=min_nodes),
        batch=BatchConfig(global_size=global_size, micro_size=micro),
        cluster=ClusterConfig(name=ClusterKind.slurm),
    )


def test_fewer_nodes_keep_the_global_batch_with_more_accumulation() -> None:
    cfg = elastic(dp=8, nodes=4, min_nodes=1, global_size=48, micro=2)
    assert cfg.split().grad_accum == 3
    splits = {n: cfg.on_nodes(n).split() for n in (1, 2, 3, 4)}
    assert {n: (s.dp, s.grad_accum, s.micro_size) for n, s in splits.items()} == {
        1: (2, 12, 2),
        2: (4, 6, 2),
        3: (6, 4, 2),
        4: (8, 3, 2),
    }
    assert all(s.global_size == 48 for s in splits.values())


@pytest.mark.parametrize("min_nodes", [0, 3])
def test_min_nodes_outside_one_to_nodes_is_refused(min_nodes: int) -> None:
    with pytest.raises(ConfigError, match=r"parallel.min_nodes.*between 1 and nodes=2"):
        ParallelConfig(dp=2, nodes=2, min_nodes=min_nodes)


def test_a_size_that_cannot_hold_the_global_batch_is_named() -> None:
    with pytest.raises(ConfigError) as err:
        elastic(dp=6, nodes=3, min_nodes=1, global_size=12, micro=2)
    assert "on 2 node(s) (dp 4)" in str(err.value) and "parallel.min_nodes=3" in err.value.fix
    elastic(dp=6, nodes=3, min_nodes=3, global_size=12, micro=2)  # the fix, as printed


def test_an_elastic_job_needs_restarts() -> None:
    """An explicit train.max_restarts=0 with parallel.min_nodes is refused, its Fix as printed."""
    with pytest.raises(ConfigError, match=r"train\.max_restarts") as err:
        RootConfig(
            parallel=ParallelConfig(dp=2, nodes=2, min_nodes=1),
            batch=BatchConfig(8, 4),
            train=TrainConfig(max_restarts=0),
        )
    assert "train.max_restarts=3" in err.value.fix


@pytest.mark.parametrize(
    ("nodes", "min_nodes", "restarts"),
    [(2, 1, 3), (4, 3, 3), (8, 1, 7), (6, 2, 4), (2, None, 0), (2, 2, 0)],
)
def test_max_restarts_null_gives_an_elastic_job_its_restarts(
    nodes: int, min_nodes: int | None, restarts: int
) -> None:
    """The default (null): 0 when not elastic; else 3 (ELASTIC_RESTARTS), or one per node the job
    may lose when that is more."""
    cfg = RootConfig(
        parallel=ParallelConfig(dp=nodes, nodes=nodes, min_nodes=min_nodes),
        batch=BatchConfig(global_size=840, micro_size=1),
        cluster=ClusterConfig(name=ClusterKind.slurm),
    )
    assert cfg.train.max_restarts == restarts and cfg.restarts == restarts
    assert cfg.on_nodes(cfg.parallel.least_nodes).restarts == restarts  # kept on fewer nodes


@pytest.mark.parametrize("explicit", [1, 5])
def test_an_explicit_max_restarts_wins(explicit: int) -> None:
    cfg = elastic(dp=2, nodes=2, min_nodes=1, global_size=8, micro=4)
    assert cfg.restarts == 3
    cfg = RootConfig(
        parallel=ParallelConfig(dp=2, nodes=2, min_nodes=1),
        batch=BatchConfig(8, 4),
        train=TrainConfig(max_restarts=explicit),
        cluster=ClusterConfig(name=ClusterKind.slurm),
    )
    assert cfg.restarts == explicit
