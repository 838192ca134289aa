"""launcher.runners.slurm_node: torchrun whose agent survives a step-wide signal and keeps status
75."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from launcher.exit_codes import STOPPED_RESUMABLE
from launcher.runners.agent import handles_signals_option
from launcher.runners.slurm_node import resumable, torchrun_args

# A stand-in rank: says it is ready, then waits for USR1 and exits as a stopped rank does.
RANK = """
import os, signal, sys, time
from pathlib import Path
stop = []
signal.signal(signal.SIGUSR1, lambda s, f: stop.append(s))
Path(sys.argv[1], "ready" + os.environ["LOCAL_RANK"]).touch()
deadline = time.monotonic() + 30
while not stop and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(int(os.environ["RANK_EXIT"]) if stop else 3)
"""


def test_resumable_only_when_no_rank_failed_otherwise() -> None:
    assert resumable([STOPPED_RESUMABLE, STOPPED_RESUMABLE])
    # torchrun's own cleanup of the ranks still running after the first one ended
    assert resumable([STOPPED_RESUMABLE, -signal.SIGTERM, -signal.SIGKILL])
    assert not resumable([STOPPED_RESUMABLE, 1])
    assert not resumable([STOPPED_RESUMABLE, -signal.SIGSEGV])
    assert not resumable([-signal.SIGTERM])
    assert not resumable([])


def test_agent_leaves_sigterm_to_the_ranks() -> None:
    args = torchrun_args(["--nproc_per_node=2", "x.py"])
    assert args[-2:] == ["--nproc_per_node=2", "x.py"]
    options = [a for a in args if a.startswith("--signals_to_handle")]
    assert len(options) == (1 if handles_signals_option() else 0), args  # told where torch can be
    assert all("SIGTERM" not in a for a in options)


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("rank_exit", "expected"), [(STOPPED_RESUMABLE, STOPPED_RESUMABLE), (5, 1)]
)
def test_signal_to_the_whole_step(rank_exit: int, expected: int, tmp_path: Path) -> None:
    """As slurmstepd does (proctrack): USR1 to every process of the step, agent and ranks alike."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    argv = [
        sys.executable,
        "-m",
        "launcher.runners.slurm_node",
        "--standalone",
        "--nproc_per_node=2",
    ]
    proc = subprocess.Popen(
        [*argv, "--monitor_interval=0.1", str(script), str(tmp_path)],
        env={**os.environ, "RANK_EXIT": str(rank_exit), "OMP_NUM_THREADS": "1"},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("ready*"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        agent = psutil.Process(proc.pid)
        for process in [agent, *agent.children(recursive=True)]:
            process.send_signal(signal.SIGUSR1)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == expected, out
