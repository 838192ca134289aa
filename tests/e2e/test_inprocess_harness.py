"""The harness that runs `launch` inside the test process (tests/inprocess.py) gives what the
command gives as a process, and leaves this process as it found it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from tests.helpers import FAST, read_metrics, run_launch
from tests.inprocess import runs_in_process

pytestmark = pytest.mark.e2e

OFF = "wandb.mode=disabled"


@pytest.mark.parametrize(
    ("args", "env", "wanted", "expected"),
    [
        (["train", OFF], {}, None, True),
        (["plan"], {}, None, True),  # plan never starts wandb
        (["train"], {}, None, False),  # wandb offline by default: its service process
        (["generate", "RUN"], {}, None, False),
        (["train", OFF], {"PYTHONPATH": "site"}, None, False),
        (["train", OFF], {"PYTHONPATH": "site"}, True, True),  # for the ranks only
        (["train", OFF, "engine=deepspeed"], {}, None, False),  # one rank: ZeRO-3 patches torch
        # several ranks: the agent would fork them from this process (launcher/runners/rank_fork.py)
        (["train", OFF, "engine=deepspeed", "parallel.dp=2"], {}, None, False),
        (["train", OFF, "parallel.dp=2"], {"PYTHONPATH": "site"}, True, False),
        (["train", "-m", OFF, "engine=deepspeed", "parallel.dp=1,2"], {}, None, False),
        (["train", OFF, "train.compile=true"], {}, None, False),
        (["train", OFF], {}, False, False),
    ],
)
def test_the_rule_keeps_a_process_where_it_matters(
    args: list[str], env: dict[str, str], wanted: bool | None, expected: bool
) -> None:
    assert runs_in_process(args, env, wanted) is expected


def test_a_refusal_reads_the_same_in_process_and_as_a_process(tmp_path: Path) -> None:
    args = ["train", "batch.grad_acum=2", *FAST]
    inside = run_launch(args, tmp_path / "a", check=False, in_process=True)
    outside = run_launch(args, tmp_path / "b", check=False, in_process=False)
    assert inside.returncode == outside.returncode == 2
    assert inside.stderr == outside.stderr and inside.stderr.startswith("error: batch.grad_acum")


def _process_facts() -> tuple[object, ...]:
    """What an in-process run must put back: environment, directory, threads, stop handlers."""
    handlers = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    return dict(os.environ), os.getcwd(), torch.get_num_threads(), handlers


def test_a_run_in_process_leaves_this_process_as_it_was(tmp_path: Path) -> None:
    before = _process_facts()
    proc = run_launch(["train", *FAST, "train.steps=2"], tmp_path / "run", in_process=True)
    assert "done: 2 steps" in proc.stdout and len(read_metrics(tmp_path / "run")) == 2
    assert _process_facts() == before
    assert not torch.distributed.is_initialized()
