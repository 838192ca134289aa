"""The bad day (issue 17, items 4, 8, 9, 14, 15), with real processes and real signals: a killed
`launch` leaves no rank behind, one run at a time per directory, the rank that died first is
named, Ctrl-C stops gracefully once and aborts twice, torchrun leaves nothing in the temp dir.

Each `launch` runs in a session of its own, as a shell job would, so that a signal can go to its
whole process group (a terminal's Ctrl-C, `kill -9 -PGID`) without reaching pytest. Runs are tiny
and sleep `debug.step_sleep_s` after each step, so there is time to act between steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from launcher.exit_codes import ABORTED, STOPPED_RESUMABLE
from tests.helpers import (
    FAST,
    REPO,
    BackgroundLaunch,
    rank_process,
    read_metrics,
    read_summary,
    run_launch,
)

pytestmark = [pytest.mark.e2e, pytest.mark.multiproc]

STEPS = 10
COMMON = ["train", f"train.steps={STEPS}", "batch.global_size=8", *FAST]
DP1 = ["parallel.dp=1", "batch.micro_size=8"]
DP2 = ["parallel.dp=2", "batch.micro_size=4"]


class Job(BackgroundLaunch):
    """`launch` in its own session, output in a file, TMPDIR private (torchrun's leftovers)."""

    def __init__(
        self, args: list[str], run_dir: Path, tmp: Path, extra: dict[str, str] | None = None
    ) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        env = {
            "WANDB_MODE": "disabled",
            "OMP_NUM_THREADS": "1",
            "TMPDIR": str(tmp),
            **(extra or {}),
        }
        log_path = tmp / f"launch_{time.monotonic_ns()}.log"
        super().__init__(args, run_dir, log_path, env, own_session=True)

    def signal_group(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()
    for proc in processes_of(*(job.run_dir for job in started)):
        proc.kill()  # nothing a test started outlives it, even when the code under test fails


def processes_of(*run_dirs: Path) -> list[psutil.Process]:
    """Every live process whose command line names one of these run directories."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if proc.info["status"] != psutil.STATUS_ZOMBIE and any(
                str(d) in cmdline for d in run_dirs
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_until_gone(run_dir: Path, timeout: float = 5.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := processes_of(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def assert_each_step_once_after_resume(run_dir: Path, logged_before: int) -> None:
    """The killed run's lines up to its checkpoint, then the rerun's: every step exactly once
    (the lines the killed run wrote after its checkpoint are dropped when the rerun resumes)."""
    steps = [m["step"] for m in read_metrics(run_dir)]
    resumed = read_summary(run_dir)["resumed_from_step"] or 0  # None: killed before a checkpoint
    assert resumed <= logged_before
    assert steps == list(range(1, STEPS + 1)), steps


def no_torchelastic_left(tmp: Path) -> list[str]:
    return [p.name for p in tmp.glob("torchelastic_*")]


# Item 8: kill -9 of `launch` (its process group) left torchrun and its ranks training on; the
# rerun then ran a second job in the directory, and metrics.jsonl held steps 16-40 twice.
def test_kill_9_of_launch_leaves_no_rank_and_the_rerun_resumes(
    tmp_path: Path, jobs: list[Job]
) -> None:
    run_dir = tmp_path / "run"
    args = [*COMMON, *DP2, "checkpoint.every=2", "debug.step_sleep_s=0.5"]
    job = Job(args, run_dir, tmp_path / "tmp")
    jobs.append(job)
    job.wait_for_step(3)
    assert len(processes_of(run_dir)) >= 3  # launch (torchrun's agent) and the two ranks
    job.signal_group(signal.SIGKILL)
    assert wait_until_gone(run_dir) == []
    logged = job.steps_logged()
    time.sleep(1.0)
    assert job.steps_logged() == logged  # nobody writes on

    # No pause in the rerun: nothing is timed against its steps.
    rerun_args = [a for a in args if not a.startswith("debug.step_sleep_s=")]
    rerun = Job(rerun_args, run_dir, tmp_path / "tmp")
    jobs.append(rerun)
    assert rerun.wait() == 0, rerun.output
    assert "resuming from" in rerun.output
    assert_each_step_once_after_resume(run_dir, logged)
    assert read_summary(run_dir)["steps"] == STEPS
    # Item 4: torchrun's scratch stayed in the run directory and went with the run.
    assert no_torchelastic_left(tmp_path / "tmp") == []
    assert not (run_dir / ".torchelastic").exists()


# Item 9: two `launch train` into one directory both wrote it (every step twice).
def test_a_second_run_into_a_running_directory_is_refused_naming_the_first(
    tmp_path: Path, jobs: list[Job]
) -> None:
    run_dir = tmp_path / "run"
    args = [*COMMON, *DP1, "checkpoint.every=2", "debug.step_sleep_s=0.5"]
    first = Job(args, run_dir, tmp_path / "tmp")
    jobs.append(first)
    first.wait_for_step(2)
    first.signal_group(signal.SIGSTOP)  # still holding the directory, however slow the others
    config = (run_dir / "config.yaml").read_text()
    for command in (args, ["plan", *args[1:], "optim.lr=0.01"]):
        second = Job(command, run_dir, tmp_path / "tmp")
        jobs.append(second)
        assert second.wait(120) == 2, second.output
        assert f"is in use by a run that is still going (pid {first.proc.pid} on" in second.output
        assert "Traceback" not in second.output
    assert (run_dir / "config.yaml").read_text() == config  # nothing of the first overwritten
    assert first.proc.poll() is None and first.steps_logged() < STEPS
    # Its holder killed, the lock is the kernel's to free: the rerun after kill -9 above.


# Item 14: after kill -9 of rank 1, `launch` blamed rank 0 ("Connection closed by peer").
# The same with ranks forked from `launch` (the default) and exec'd as torchrun does it
# (LAUNCHER_RANK_START=exec, and what a GPU machine gets): launcher/runners/rank_fork.py.
@pytest.mark.parametrize("start", ["fork", "exec"])
def test_the_rank_that_died_first_is_named_with_its_signal(
    start: str, tmp_path: Path, jobs: list[Job]
) -> None:
    run_dir = tmp_path / "run"
    args = [*COMMON, *DP2, "debug.step_sleep_s=0.5"]
    job = Job(args, run_dir, tmp_path / "tmp", {"LAUNCHER_RANK_START": start})
    jobs.append(job)
    job.wait_for_step(2)
    rank = rank_process(job.proc.pid, 1)
    assert rank.ppid() == job.proc.pid  # torchrun's agent runs in `launch`
    if start == "fork":
        assert rank.name() == "rank1"
        assert rank.cmdline() == psutil.Process(job.proc.pid).cmdline()
    else:
        assert rank.cmdline()[-3:-1] == ["-m", "launcher.worker"], rank.cmdline()
    rank.kill()
    assert job.wait() == 1, job.output
    errors = [line for line in job.output.splitlines() if line.startswith("error: ")]
    assert errors and errors[-1].startswith("error: rank 1 died first (SIGKILL, exit -9)"), errors
    assert "rank 0 then failed" in errors[-1]
    failures = json.loads((run_dir / "rank_failures.json").read_text())
    assert failures[0]["rank"] == 1 and failures[0]["signal"] == "SIGKILL"
    assert wait_until_gone(run_dir) == []
    assert no_torchelastic_left(tmp_path / "tmp") == []


# Item 15: Ctrl-C exited 130 with a traceback (dp=1) or 1 "the job failed" (dp=2), saving nothing.
@pytest.mark.parametrize("split", ["dp1", "dp2"])
def test_ctrl_c_stops_after_the_step_and_saves(split: str, tmp_path: Path, jobs: list[Job]) -> None:
    run_dir = tmp_path / "run"
    job = Job(
        [*COMMON, *(DP1 if split == "dp1" else DP2), "debug.step_sleep_s=0.5"],
        run_dir,
        tmp_path / "tmp",
    )
    jobs.append(job)
    job.wait_for_step(2)
    job.signal_group(signal.SIGINT)  # as a terminal sends it: to the foreground process group
    assert job.wait() == STOPPED_RESUMABLE, job.output
    out = job.output
    assert "stopping after this step" in out and "press Ctrl-C again to abort" in out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    marker = json.loads((run_dir / "stopped.json").read_text())
    assert marker["signal"] == "SIGINT"
    assert (run_dir / "checkpoints" / f"step_{marker['step']}" / "complete.json").is_file()
    assert len(read_metrics(run_dir)) == marker["step"]
    assert not list(run_dir.glob("error_rank*.txt"))
    assert wait_until_gone(run_dir) == []


PAUSE_S = 16
"""debug.step_sleep_s of the double Ctrl-C test. Step 1's metrics line is written during step 2,
after one pause: each run costs one pause, and an abort that waited for the boundary would end
about a pause after the second Ctrl-C."""


@pytest.mark.parametrize("split", ["dp1", "dp2"])
def test_a_second_ctrl_c_aborts_at_once(split: str, tmp_path: Path, jobs: list[Job]) -> None:
    run_dir = tmp_path / "run"
    # A pause after each step: the first Ctrl-C waits for its end (the step boundary), the second
    # must not. Its deadline is half the pause, so a wait for the boundary cannot pass.
    job = Job(
        [*COMMON, *(DP1 if split == "dp1" else DP2), f"debug.step_sleep_s={PAUSE_S}"],
        run_dir,
        tmp_path / "tmp",
    )
    jobs.append(job)
    job.wait_for_step(1)
    job.signal_group(signal.SIGINT)
    time.sleep(0.5)
    job.signal_group(signal.SIGINT)
    assert job.wait(timeout=PAUSE_S / 2) == ABORTED, job.output
    assert job.steps_logged() == 1, job.output
    out = job.output
    assert "aborted (Ctrl-C)" in out and "Traceback" not in out
    assert not (run_dir / "stopped.json").exists()
    assert wait_until_gone(run_dir) == []


# Items 8 and 9 on a SLURM node: what each srun task runs (launcher.runners.slurm_node) holds the
# run directory on the first node, and its ranks die with it.
def test_a_slurm_node_holds_the_directory_and_its_ranks_die_with_it(
    tmp_path: Path, jobs: list[Job]
) -> None:
    run_dir = tmp_path / "run"
    args = [*COMMON[1:], *DP2, "debug.step_sleep_s=0.5"]
    run_launch(["plan", *args], run_dir, env={"WANDB_MODE": "disabled"})
    node = [sys.executable, "-m", "launcher.runners.slurm_node", "--standalone"]
    node += ["--nproc_per_node=2", "-m", "launcher.worker", str(run_dir / "config.yaml")]

    def start(job_id: str) -> subprocess.Popen[str]:
        env = {**os.environ, "SLURM_NODEID": "0", "SLURM_JOB_ID": job_id, "OMP_NUM_THREADS": "1"}
        return subprocess.Popen(
            node, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    first = start("4242")
    try:
        deadline = time.monotonic() + 180
        while not (run_dir / "metrics.jsonl").is_file():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
            time.sleep(0.05)
        second = start("4243")
        out, _ = second.communicate(timeout=60)
        assert second.returncode == 2, out
        assert f"(pid {first.pid} on" in out and "(SLURM job 4242)" in out
        first.kill()  # the agent only: its ranks must follow
        first.wait()
        assert wait_until_gone(run_dir) == []
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        for proc in processes_of(run_dir):
            proc.kill()
