"""Core tokens: pytest-xdist's workers share this machine's cores without burying them in ranks.

`scripts/test.sh` runs two xdist workers per core; they share TOKENS_PER_CORE tokens per
core. Each test holds one while it runs (set-up and tear-down included); a launch of several ranks
takes one per rank for as long as it runs (`tests.helpers.run_launch`, `BackgroundLaunch`); a test
marked `multiproc` or `slurm` holds one per core. So no more than TOKENS_PER_CORE busy processes
share a core. (Plain xdist, with no
bound on the ranks, made the suite slower than serial.)

The tokens are flock(2)ed files in a directory the controller makes (LAUNCHER_TEST_CORES names
it); the kernel drops a dead worker's locks. A test that wants several tokens takes whichever are
free and holds the gate while it waits for the rest, so one-token tests cannot starve it; nobody
waits for anything else while holding tokens (`Cores.waiting`). Without xdist nothing is taken.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DIR_ENV = "LAUNCHER_TEST_CORES"
COUNT_ENV = "LAUNCHER_TEST_CORE_COUNT"
_POLL_S = 0.02
TOKENS_PER_CORE = int(os.environ.get("LAUNCHER_TEST_TOKENS_PER_CORE", "3"))
"""Three: a test that mostly waits (on a signal, a queue, a rendezvous, a timeout) leaves its core
to another worker's test. Measured on two cores: 1 per core 994 s of pytest, 2 per core 841 s;
with 2 per core a whole-suite CPU profile (2026-12-05) found the cores busy 65% of the time, the
workers mostly waiting for tokens; most of that wait (2026-12-06) was a several-token take
blocking on the first tokens in order while others were free, fixed: now 89% busy. The
deadline-bound modules (hang, faults, two-node torchrun, elastic, resume) passed at 3 per core
with four workers under a load average of 8 (other work on the machine besides)."""


def _lock(path: Path, blocking: bool) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class Cores:
    def __init__(self, directory: Path, count: int) -> None:
        self.tokens = [directory / f"core{i}" for i in range(count)]
        self.gate = directory / "gate"
        self.held: list[int] = []
        # For tests/suite_profile.py: token-seconds held and seconds spent waiting in take().
        self.token_seconds = 0.0
        self.wait_seconds = 0.0
        self._since = time.monotonic()

    def _account(self) -> None:
        now = time.monotonic()
        self.token_seconds += len(self.held) * (now - self._since)
        self._since = now

    @property
    def count(self) -> int:
        return len(self.tokens)

    def take(self, wanted: int) -> None:
        """Block until `wanted` tokens (at most all) are this worker's; holds none before."""
        assert not self.held, "tokens are taken once per test (release first)"
        wanted = min(max(wanted, 0), self.count)
        asked = time.monotonic()
        try:
            self._take(wanted)
        finally:
            self._since = time.monotonic()
            self.wait_seconds += self._since - asked

    def _take(self, wanted: int) -> None:
        if wanted > 1:  # the gate held until all are ours: one-token takers cannot starve us
            gate = _lock(self.gate, blocking=True)
            try:
                while True:
                    self._grab_free(wanted)
                    if len(self.held) == wanted:
                        return
                    time.sleep(_POLL_S)
            finally:
                os.close(gate)
        while wanted:
            gate = _lock(self.gate, blocking=True)
            try:
                if self._grab_free(1):
                    return
            finally:
                os.close(gate)
            time.sleep(_POLL_S)

    def _grab_free(self, wanted: int) -> bool:
        """Any free tokens, until `wanted` are held (whichever they are: waiting for particular
        ones would wait on a long test's token while others are free). A token this worker holds
        already fails the non-blocking lock like another's (flock is per open file)."""
        for path in self.tokens:
            if len(self.held) == wanted:
                break
            fd = _lock(path, blocking=False)
            if fd is not None:
                self.held.append(fd)
        return len(self.held) == wanted

    def release(self) -> None:
        self._account()
        for fd in self.held:
            os.close(fd)
        self.held = []

    @contextmanager
    def at_least(self, wanted: int) -> Iterator[None]:
        """At least `wanted` tokens inside; what was held before, after."""
        before = len(self.held)
        if before >= min(wanted, self.count):
            yield
            return
        self.release()
        self.take(wanted)
        try:
            yield
        finally:
            self.release()
            self.take(before)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """No tokens inside (to wait for another worker), the same number again after."""
        before = len(self.held)
        self.release()
        try:
            yield
        finally:
            self.take(before)


_cores: Cores | None = None


def cores() -> Cores | None:
    """This xdist worker's tokens; None outside xdist (nothing to share)."""
    global _cores
    directory = os.environ.get(DIR_ENV)
    if _cores is None and directory and os.environ.get("PYTEST_XDIST_WORKER"):
        _cores = Cores(Path(directory), int(os.environ.get(COUNT_ENV, "2")))
    return _cores


@contextmanager
def at_least(wanted: int) -> Iterator[None]:
    found = cores()
    if found is None or wanted <= 1:
        yield
        return
    with found.at_least(wanted):
        yield


def hold_at_least(wanted: int) -> None:
    """At least `wanted` tokens until the test ends (a background launch's ranks)."""
    found = cores()
    if found is not None and len(found.held) < min(wanted, found.count):
        found.release()
        found.take(wanted)


@contextmanager
def waiting() -> Iterator[None]:
    found = cores()
    if found is None:
        yield
        return
    with found.waiting():
        yield


def ranks_started_by(args: list[str]) -> int:
    """How many ranks `launch <args>` runs on this machine at once (a sweep's points run one
    after another; SLURM's run in the cluster's jobs, whose tests hold every token)."""
    if not args or args[0] not in ("train", "verify") or "cluster=slurm" in args:
        return 1
    most = {"parallel.dp": 1, "parallel.tp": 1, "parallel.pp": 1}  # the world is dp x tp x pp
    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        sizes = [int(v) for v in value.split(",") if v.strip().isdigit()]
        if key in most:
            most[key] = max([most[key], *sizes])
    return most["parallel.dp"] * most["parallel.tp"] * most["parallel.pp"]
