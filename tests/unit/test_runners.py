"""The runner is chosen once from the config; the plan is complete (what `launch plan` shows is
what `launch train` writes and runs). What `launch train cluster=slurm` submits is tested on the
real cluster (tests/slurm/test_slurm_submit.py), never against a stand-in sbatch."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from launcher import commands, prepare
from launcher.config import to_root_config
from launcher.config.root import RootConfig
from launcher.plan import Plan, build_plan
from launcher.runners import Runner, runner_for
from launcher.runners.inprocess import InProcessRunner
from launcher.runners.slurm import SlurmRunner
from launcher.runners.torchrun import TorchrunRunner


def config(**sections: dict[str, Any]) -> RootConfig:
    base: dict[str, Any] = {"wandb": {"mode": "disabled"}}
    base.update(sections)
    return to_root_config(base)


SLURM = {"name": "slurm", "python": "/opt/venv/bin/python"}


@pytest.mark.parametrize(
    ("sections", "kind", "name"),
    [
        ({}, InProcessRunner, "in-process"),
        ({"parallel": {"dp": 2}}, TorchrunRunner, "torchrun"),
        ({"cluster": SLURM}, SlurmRunner, "slurm"),
        ({"cluster": SLURM, "parallel": {"dp": 4, "nodes": 2}}, SlurmRunner, "slurm"),
    ],
)
def test_runner_is_chosen_from_the_config(sections: dict, kind: type[Runner], name: str) -> None:
    runner = runner_for(config(**sections))
    assert type(runner) is kind and runner.name == name


def test_only_runners_here_check_this_machines_devices() -> None:
    cpu = {"device": "cpu"}
    assert runner_for(config(train=cpu)).check_environment(config(train=cpu)) == "cpu"
    # A SLURM job runs on other machines: nothing to check here, no device type to report.
    slurm = config(cluster=SLURM, train=cpu)
    assert runner_for(slurm).check_environment(slurm) is None
    # so the engine's device checks (DeepSpeed refuses fp16 on CPU) apply to local runs only
    fp16 = {"device": "cpu", "precision": "fp16"}
    prepare.check_environment(config(cluster=SLURM, engine={"name": "deepspeed"}, train=fp16))


@pytest.mark.parametrize(
    ("sections", "files"),
    [
        ({}, []),
        (
            {"engine": {"name": "deepspeed", "zero_stage": 2}, "parallel": {"dp": 2}},
            ["ds_config.json"],
        ),
        ({"cluster": SLURM, "parallel": {"dp": 2}}, ["train.sbatch"]),
        (
            {"cluster": SLURM, "engine": {"name": "deepspeed"}, "parallel": {"dp": 4, "nodes": 2}},
            ["ds_config.json", "train.sbatch"],
        ),
    ],
)
def test_plan_holds_every_file_it_writes(tmp_path: Path, sections: dict, files: list[str]) -> None:
    plan = commands.plan_command(config(**sections), tmp_path)
    assert list(plan.files) == files
    for name, text in plan.files.items():
        assert (tmp_path / name).read_text(encoding="utf-8") == text  # byte for byte
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["files"] == files
    assert written["command"] == plan.command and written["env"] == plan.env
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".lock", "config.yaml", "plan.json", *files]  # .lock: the run directory's lock
    )
    if "train.sbatch" in files:
        assert (tmp_path / "train.sbatch").stat().st_mode & stat.S_IXUSR


def test_plan_is_the_same_whoever_builds_it(tmp_path: Path) -> None:
    """build_plan is a function of the config and the run directory: `launch plan` and `launch
    train` get the same plan, env and files included."""
    cfg = config(cluster=SLURM, engine={"name": "deepspeed"}, parallel={"dp": 2})
    first = build_plan(cfg, tmp_path, runner_for(cfg))
    again = build_plan(cfg, tmp_path, runner_for(cfg))
    assert first == again and first.runner == "slurm"
    assert first.command[-1] == str(tmp_path.resolve() / "train.sbatch")


def test_train_hands_the_plan_to_its_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Plan] = []

    def run(self: Runner, cfg: RootConfig, run_dir: Path, plan: Plan) -> int:
        seen.append(plan)
        return 3

    monkeypatch.setattr(TorchrunRunner, "run", run)
    cfg = config(parallel={"dp": 2}, engine={"name": "deepspeed"})
    assert commands.train_command(cfg, tmp_path) == 3
    [plan] = seen
    assert plan.runner == "torchrun" and "launcher.worker" in plan.command
    assert json.loads((tmp_path / "plan.json").read_text()) == plan.to_json()
    assert (tmp_path / "ds_config.json").read_text() == plan.files["ds_config.json"]


def test_in_process_runner_runs_the_worker_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import launcher.worker.run as worker_run

    calls: list[Path] = []

    def run_in_process(cfg: RootConfig, run_dir: Path) -> int:
        calls.append(run_dir)
        return 0

    monkeypatch.setattr(worker_run, "run_in_process", run_in_process)
    cfg = config()
    runner = runner_for(cfg)
    assert runner.run(cfg, tmp_path, build_plan(cfg, tmp_path, runner)) == 0
    assert calls == [tmp_path]


def test_in_process_runs_cap_threads_like_torchrun_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17, item 5: in-process runs used every core whatever else ran."""
    import torch

    from launcher.runners import local
    from launcher.worker import run as worker_run

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(local, "local_cpu_count", lambda: 3)
    one, two = config(), config(parallel={"dp": 2})
    assert InProcessRunner().environment(one) == {"OMP_NUM_THREADS": "3"}
    assert TorchrunRunner().environment(two)["OMP_NUM_THREADS"] == "1"  # 3 cores // 2 ranks
    plan = commands.plan_command(one, tmp_path)
    assert (
        plan.env == {"OMP_NUM_THREADS": "3"} and "env         OMP_NUM_THREADS=3" in plan.describe()
    )
    seen: list[int] = []

    def run_in_process(cfg: RootConfig, run_dir: Path) -> int:
        seen.append(torch.get_num_threads())
        return 0

    monkeypatch.setattr(worker_run, "run_in_process", run_in_process)
    before = torch.get_num_threads()
    plan.env["OMP_NUM_THREADS"] = "1"
    assert InProcessRunner().run(one, tmp_path, plan) == 0
    assert seen == [1] and torch.get_num_threads() == before
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's choice stands
    assert InProcessRunner().environment(one) == {}


def test_blame_names_the_rank_that_died_first(tmp_path: Path) -> None:
    from launcher.runners.agent import RankFailure, blame

    (tmp_path / "error_rank0.txt").write_text(
        "Traceback ...\nRuntimeError: Connection closed by peer\n"
    )
    killed, failed = RankFailure(1, -9, 1000), RankFailure(0, 1, 999)
    text = blame([killed, failed], tmp_path)
    assert text.startswith(
        "rank 1 died first (SIGKILL, exit -9); rank 0 then failed (exit 1): RuntimeError: "
        "Connection closed by peer"
    )
    # rank 0 not among torchrun's failures (it ended after torchrun noticed rank 1)
    assert blame([killed], tmp_path).startswith(
        "rank 1 died first (SIGKILL, exit -9); rank 0 then failed: RuntimeError: Connection"
    )
    assert blame([failed], tmp_path).startswith("rank 0 failed first (exit 1): RuntimeError")


def test_failures_are_ordered_signal_first_then_by_time() -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from launcher.runners.agent import failures_of

    def failure(rank: int, code: int) -> ProcessFailure:
        return ProcessFailure(
            local_rank=rank, pid=100 + rank, exitcode=code, error_file="/nonexistent"
        )

    exc = ChildFailedError("x", {0: failure(0, 1), 1: failure(1, -9), 2: failure(2, 1)})
    exc.failures[0].timestamp = 5  # rank 0 raised before rank 2; rank 1 was killed
    exc.failures[2].timestamp = 7
    exc.failures[1].timestamp = 9  # torchrun's notice, later than the kill
    assert [f.rank for f in failures_of(exc)] == [1, 0, 2]


def test_a_rank_torchrun_stopped_is_not_blamed(tmp_path: Path) -> None:
    """Rank 1 raised; torchrun then stopped rank 0 with SIGTERM (seen in a real run: the blame
    named rank 0). SIGTERM is torchrun's cleanup, so the rank that raised comes first."""
    from launcher.runners.agent import RankFailure, blame

    (tmp_path / "error_rank1.txt").write_text("Traceback ...\nRuntimeError: raises on purpose\n")
    (tmp_path / "error_rank0.txt").write_text("RuntimeError: Connection closed by peer\n")
    os.utime(tmp_path / "error_rank1.txt", (100.0, 100.0))
    os.utime(tmp_path / "error_rank0.txt", (100.5, 100.5))
    stopped, raised = RankFailure(0, -15, 100), RankFailure(1, 1, 100)
    text = blame([stopped, raised], tmp_path)
    assert text.startswith("rank 1 failed first (exit 1): RuntimeError: raises on purpose; ")
    assert "rank 0 then died (SIGTERM, exit -15)" in text
    # Two ranks that both raised, at the same torchrun second: the earlier error file first.
    later = RankFailure(0, 1, 100)
    assert blame([later, raised], tmp_path).startswith("rank 1 failed first")
