"""cluster=local elastic jobs: `launch` starts its own agent once the other agents are ready to
join (each closes a pipe), or have died, so that the first rendezvous has every node; a
hung agent never keeps it waiting past the deadline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.parametrize("ends", ["os.close(FD)\ntime.sleep(30)", "os._exit(3)"])
def test_launch_waits_for_each_agent_to_be_ready_or_gone(tmp_path: Path, ends: str) -> None:
    marker = tmp_path / "imported"
    proc, ready = _agent(f"time.sleep(0.5)\nopen({str(marker)!r}, 'w').close()\n{ends}")
    try:
        local_nodes._wait_until_ready([ready])
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
        local_nodes._wait_until_ready([ready])
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
    assert os.read(read_end, 1) == b""  # EOF: no writer left
    assert local_nodes.READY_FD_ENV not in os.environ  # its ranks do not inherit it
    os.close(read_end)
