"""The run-directory lock and the parent-death signal, with real processes and real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from launcher.lifetime import RunDirectoryBusy, RunLock

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from launcher.lifetime import RunLock
    RunLock(Path(sys.argv[1])).acquire()
    print("locked", flush=True)
    time.sleep(60)
    """
)


def _start_holder(run_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def test_second_holder_is_refused_with_the_holder_named(tmp_path: Path) -> None:
    holder = _start_holder(tmp_path)
    try:
        with pytest.raises(RunDirectoryBusy, match=rf"pid {holder.pid} on .*hydra.run.dir"):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()


def test_kill_9_of_the_holder_frees_the_lock(tmp_path: Path) -> None:
    holder = _start_holder(tmp_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with RunLock(tmp_path) as lock:
        assert lock.fd is not None


def test_a_child_that_inherited_the_lock_keeps_it(tmp_path: Path) -> None:
    lock = RunLock(tmp_path).acquire()
    assert lock.fd is not None
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(lock.fd,)
    )
    lock.release()
    try:
        with pytest.raises(RunDirectoryBusy):
            RunLock(tmp_path).acquire()
    finally:
        child.kill()
        child.wait()
    RunLock(tmp_path).acquire().release()


PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from launcher.lifetime import die_with_parent
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=die_with_parent
    )
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_child_dies_with_its_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert psutil.pid_exists(child_pid)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert _wait_gone(child_pid), "the child outlived its killed parent"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_rank_whose_agent_is_already_gone_dies_at_once() -> None:
    """A rank names its agent (LAUNCHER_AGENT_PID): if that is not its parent any more, the agent
    died before the rank could ask to die with it."""
    code = (
        "from launcher.lifetime import die_with_parent; die_with_parent(parent=1); print('alive')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "alive" not in proc.stdout


def test_exit_now_runs_the_exit_handlers_and_keeps_the_status(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import atexit, sys
        from pathlib import Path
        from launcher.lifetime import exit_now
        atexit.register(lambda: Path({str(tmp_path / "handler_ran")!r}).touch())
        print("buffered", end="")
        exit_now(75)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 75 and proc.stdout == "buffered"
    assert (tmp_path / "handler_ran").exists()
