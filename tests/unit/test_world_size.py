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
