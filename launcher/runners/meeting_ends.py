"""cluster=torchrun: how a node's meeting ends other than by training, in the launcher's words:
a stop signal while it waits, node 0 gone, torchrun's rendezvous failed."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from launcher.config.rendezvous import NodeRendezvous

if TYPE_CHECKING:
    from launcher.runners.meeting import Meeting


@contextmanager
def stop_raises(rdzv: NodeRendezvous, hosts: bool) -> Iterator[None]:
    """SIGTERM in the meeting: one line (and the seat given back), not a silent 143."""

    from launcher.runners.meeting import StoppedInMeeting

    again = (
        "start the same command on every node again (this node held the rendezvous)."
        if hosts
        else "start the same command on this node again to rejoin."
    )

    def stop(signum: int, frame: object) -> None:
        raise StoppedInMeeting(
            f"stopped (SIGTERM) while waiting for the other nodes at {rdzv.endpoint} "
            f"({rdzv.rdzv_id}); no training had started. Fix: {again}"
        )

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def host_gone(meeting: Meeting) -> bool:
    """Whether node 0's store no longer answers this node."""
    from launcher.runners.meeting import FIRST_KEY

    try:
        meeting.store.check([FIRST_KEY])
    except RuntimeError:
        return True
    return False


def rendezvous_lost(rdzv: NodeRendezvous, exc: Exception, hosts: bool) -> str:
    """torchrun's rendezvous error, in the launcher's words."""
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

    if isinstance(exc, RendezvousTimeoutError):
        return (
            f"cluster.rdzv_timeout: a node of the job at {rdzv.endpoint} ({rdzv.rdzv_id}) left "
            f"and did not come back within {rdzv.timeout} s. Fix: see the other nodes' output, "
            "then start the same command on every node again (it resumes from the last "
            "checkpoint)."
        )
    if hosts:
        return (
            f"the rendezvous at {rdzv.endpoint} failed ({exc}). Fix: start the same command "
            "on every node again (it resumes from the last checkpoint)."
        )
    return (
        f"node 0 (the rendezvous host at {rdzv.endpoint}) is gone: this node lost its "
        f"connection to it. Fix: see node 0's output, then start the same command on every node "
        "again (it resumes from the last checkpoint)."
    )
