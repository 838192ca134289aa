"""cluster=local elastic jobs: `launch` starts its own agent once the other agents are ready to
join (each writes a byte to a pipe), or have died (the pipe closed without one), so that the
first rendezvous has every node; a hung agent never keeps it waiting past the deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.runners import local_nodes


def _agent(code: str) -> tuple[subprocess.Popen[bytes], int]:
    """A child holding the write end of a readiness pipe, running `code` (fd in FD)."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import os, time\nFD = {write_end}\n{code}"],
        pass_fds=(write_end,),
    )
    os.close(write_end)
    return proc, read_end


@pytest.mark.parametrize(
    ("ends", "gone"),
    [("os.write(FD, b'1')\nos.close(FD)\ntime.sleep(30)", False), ("os._exit(3)", True)],
    ids=["ready", "gone"],
)
def test_launch_waits_for_each_agent_to_be_ready_or_gone(
    tmp_path: Path, ends: str, gone: bool
) -> None:
    marker = tmp_path / "imported"
    proc, ready = _agent(f"time.sleep(0.5)\nopen({str(marker)!r}, 'w').close()\n{ends}")
    try:
        assert local_nodes._wait_until_ready([ready]) == [gone]
        assert marker.exists()  # not before the agent was ready (or gone)
    finally:
        proc.kill()
        proc.wait()


def test_an_agent_that_never_says_it_is_ready_does_not_hold_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local_nodes, "READY_TIMEOUT_S", 0.5)
    proc, ready = _agent("time.sleep(30)")
    try:
        assert local_nodes._wait_until_ready([ready]) == [False]  # not known to be gone
        assert proc.poll() is None  # launch goes on; the rendezvous admits the agent later
    finally:
        proc.kill()
        proc.wait()


def test_an_agent_says_ready_by_closing_the_pipe_it_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_end, write_end = os.pipe()
    monkeypatch.setenv(local_nodes.READY_FD_ENV, str(write_end))
    local_nodes._say_ready()
    assert os.read(read_end, 2) == b"1"  # ready
    assert os.read(read_end, 1) == b""  # EOF: no writer left
    assert local_nodes.READY_FD_ENV not in os.environ  # its ranks do not inherit it
    os.close(read_end)


def _startup_that(tmp_path: Path, code: str) -> dict[str, str]:
    """An environment whose interpreters run `code` at start-up (sitecustomize), before any
    import of the agent's: an agent slow to import, or one that dies first."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import os, time\n{code}\n")
    return {"PYTHONPATH": str(site)}


def _nodes(n: int) -> Any:
    return SimpleNamespace(parallel=SimpleNamespace(nodes=n))


def test_an_agent_that_exits_before_joining_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = _startup_that(tmp_path, "os._exit(3)")
    with local_nodes.other_nodes(_nodes(2), [f"--log-dir={tmp_path}/scratch"], env) as procs:
        assert procs[0].returncode == 3  # gone, and reaped, before `launch` starts its own agent
    assert "node 1's agent exited (status 3) before joining" in caplog.text


def test_an_agent_still_importing_dies_with_launch(tmp_path: Path) -> None:
    """kill -9 of `launch` while it waits for an agent's imports: the agent goes too (its
    parent-death signal is set before it runs any Python)."""
    env = _startup_that(tmp_path, "time.sleep(60)")
    code = textwrap.dedent(
        f"""
        from types import SimpleNamespace
        from launcher.runners import local_nodes
        nodes = SimpleNamespace(parallel=SimpleNamespace(nodes=2))
        with local_nodes.other_nodes(nodes, ["--log-dir={tmp_path}/scratch"], {env!r}):
            pass
        """
    )
    launch = subprocess.Popen([sys.executable, "-c", code])
    children = Path(f"/proc/{launch.pid}/task/{launch.pid}/children")
    try:
        agent = None
        for _ in range(300):
            pids = children.read_text().split() if children.exists() else []
            if pids:
                agent = int(pids[0])
                break
            time.sleep(0.1)
        assert agent is not None, "launch started no agent"
        launch.kill()
        launch.wait()
        for _ in range(100):  # gone, or a zombie waiting for init to reap it
            try:
                state = Path(f"/proc/{agent}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                break
            if state == "Z":
                break
            time.sleep(0.1)
        else:
            os.kill(agent, 9)
            raise AssertionError("the agent outlived launch by 10 s")
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
