"""A node's first wait at cluster=torchrun's meeting (launcher/runners/meeting.py): reaching
node 0's store. Where none answers, one line names the endpoint, with no C++ stack from torch's
TCPStore (whose own connect also waits about twice its timeout); a node 0 that comes late is
reached."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from launcher.config.rendezvous import NodeRendezvous
from launcher.errors import ConfigError
from launcher.runners.meeting import Meeting, RendezvousFailed
from launcher.runners.seats import free_port


def rendezvous(port: int, node_rank: int) -> NodeRendezvous:
    return NodeRendezvous(
        host="127.0.0.1", port=port, rdzv_id="job", nodes=2, least_nodes=2,
        node_rank=node_rank, timeout=2,
    )  # fmt: skip


def test_no_node_0_is_one_line_without_torchs_stack(capfd: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    with pytest.raises(RendezvousFailed) as info:
        Meeting.open(rendezvous(port, 1))
    assert f"no node 0 answered at 127.0.0.1:{port} within 2 s" in str(info.value)
    _, err = capfd.readouterr()
    assert "TCPStore" not in err and "frame #" not in err, err


def test_node_0_that_comes_late_is_reached() -> None:
    port = free_port()
    hosts: list[Meeting] = []

    def node_0() -> None:
        time.sleep(0.5)  # the other node is waiting already
        hosts.append(Meeting.open(rendezvous(port, 0)))

    thread = threading.Thread(target=node_0)
    thread.start()
    node_1 = Meeting.open(rendezvous(port, 1))
    thread.join()
    node_1.store.set("said", "hello")
    assert hosts[0].store.get("said") == b"hello"


def test_another_program_on_the_port_is_one_error_not_a_wait_for_ever() -> None:
    """torch's TCPStore client waits for ever for a greeting that a program other than a store
    (an HTTP server, here a socket that never answers) does not send, whatever its timeout."""
    with socket.create_server(("127.0.0.1", 0)) as other:
        port = other.getsockname()[1]
        with pytest.raises(ConfigError) as info:
            Meeting.open(rendezvous(port, 1))
    error = info.value
    assert error.keys == ["cluster.rdzv_endpoint"], error.keys
    assert f"something at 127.0.0.1:{port} accepts connections" in str(error)
    assert "cluster.rdzv_endpoint=127.0.0.1:" in str(error)


NODE_0 = """
import sys, time
from tests.unit.test_meeting_open import Meeting, rendezvous
meeting = Meeting.open(rendezvous(int(sys.argv[1]), 0))
print("ready", flush=True)
time.sleep(60)
"""


def test_a_second_node_given_rank_0_is_told_to_take_another_rank() -> None:
    """torch's multi-tenant store shares one server within a process: node 0 runs in its own."""
    port = free_port()
    node_0 = subprocess.Popen(
        [sys.executable, "-c", NODE_0, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert node_0.stdout is not None and node_0.stdout.readline() == "ready\n"
        with pytest.raises(ConfigError) as info:
            Meeting.open(rendezvous(port, 0))
        with pytest.raises(ConfigError) as other:
            Meeting.open(replace(rendezvous(port, 0), rdzv_id="other"))
    finally:
        node_0.kill()
        node_0.wait()
    assert info.value.keys == ["cluster.node_rank"], info.value
    assert "has its node 0 already" in str(info.value)
    assert "e.g. cluster.node_rank=1" in info.value.fix
    assert "taken by another job, 'job'" in str(other.value)
