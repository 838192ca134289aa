"""A free rendezvous port per SLURM job (launcher/runners/ports.py): derived from the job id so
that jobs sharing a node start apart, and never a port something already listens on."""

from __future__ import annotations

import socket
import subprocess
import sys

from launcher.runners.ports import BASE, SPAN, job_port


def test_jobs_start_apart_and_pass_over_taken_ports() -> None:
    assert job_port(1234, free=lambda port: True) == BASE + 234
    assert job_port(1235, free=lambda port: True) == BASE + 235
    taken = {BASE + 234, BASE + 236}  # the previous job's port; a port of another job
    looked: list[int] = []

    def free(port: int) -> bool:
        looked.append(port)
        return port not in taken

    # 234 taken; 235 free but its neighbour (verify's port) 236 taken; 237 and 238 free.
    assert job_port(1234, free=free) == BASE + 237
    assert job_port(2234, free=lambda port: port not in taken) == BASE + 237  # 1000 apart
    assert job_port(999, free=lambda port: port != BASE + 999) == BASE  # wraps in the span
    assert job_port(5, free=lambda port: False) == BASE + 5  # none free: the first


def test_a_port_something_listens_on_is_never_the_jobs() -> None:
    with socket.socket() as listening:
        listening.bind(("", 0))
        listening.listen()
        port = listening.getsockname()[1]
        base = port - 7
        found = job_port(7, base=base, span=SPAN)  # job 7 would start at `port`
        assert found != port and base <= found < base + SPAN


def test_train_sbatch_runs_it_as_a_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "launcher.runners.ports", "4321"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert BASE <= int(out.stdout) < BASE + SPAN
