"""A rank's progress, for the watchdog of the process that started it
(launcher/runners/watchdog.py).

Each rank started by torchrun's agent keeps `<run dir>/heartbeats/rank<r>.json` up to date: its
host, pid, the step it is at, and the deadline by which it must next report (now +
hang_timeout; none with train.hang_timeout=0), or none while it is in a phase that the watchdog
does not time: start-up and the
first step of the process (model building, compilation, a resume), a checkpoint save, the end.
One file write per optimizer step (at its end, which sets the next step's deadline), atomic
(written beside, then renamed), nothing collective.

After training the rank writes one record per phase of its end (`final save`, `evaluation`,
`harness wait`, `tracker finish`, `teardown`) and, as the last thing before its process exits,
`exit` with its exit status. Those phases have no deadline of their own (a final save or an
evaluation takes what it takes), but once one rank has exited cleanly every rank still running
must follow within train.hang_timeout of that exit or of its own latest phase, whichever is later
(plus `allow_s`, a phase's own bound, such as eval.harness.wait_s): launcher/runners/held.py.
The records after the final save say where it is (`final_checkpoint`) and how many steps the run
has (`steps`), so the watchdog can tell whether the run's work is complete and saved.

On SIGUSR2 the rank writes the Python stacks of all its threads into `rank<r>.stacks`
(faulthandler: the kernel runs it even while the rank waits inside a collective).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from launcher.config.root import RootConfig
from launcher.lifetime import AGENT_PID_ENV
from launcher.rundir import heartbeat_file, stacks_file
from launcher.userpath.own import open_own

if TYPE_CHECKING:
    from launcher.checkpoint.checkpointer import Checkpointer

DUMP_SIGNAL = signal.SIGUSR2
"""The signal the watchdog sends a rank for its stacks."""
FINAL_SAVE = "final save"
SAVE_WRITTEN = "final save written"
"""This rank's part of the final save is done (rank 0's: with the completion record); it waits
for the others (launcher/runners/held_save.py)."""
EXIT_PHASE = "exit"
"""The last record of a rank, with its exit status (a clean exit: 0, and its process gone)."""


class Heartbeat:
    """A step callback (place it before the checkpoints): reports each step's start and end.

    saves_after: whether a checkpoint is saved after this step (the save is not timed).
    """

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        timeout_s: float,
        saves_after: Callable[[int], bool],
    ) -> None:
        self.path = heartbeat_file(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.timeout_s, self.saves_after = rank, timeout_s, saves_after
        self.first: int | None = None
        self.step = 0
        self.timed = False
        self.host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self._stacks: IO[str] | None = None
        self.facts: dict[str, Any] = {}
        """Kept in every record once known: ended (training is over), final_checkpoint, steps."""
        self.beat(0, "start", timed=False)

    def untimed_after(self, saves_after: Callable[[int], bool]) -> None:
        """The steps after which a checkpoint is saved (not timed) besides the last one."""
        last = self.saves_after
        self.saves_after = lambda step: last(step) or saves_after(step)

    def dump_stacks_on_signal(self) -> None:
        """SIGUSR2 writes this rank's stacks (all threads) to heartbeats/rank<r>.stacks."""
        path = stacks_file(self.path.parent.parent, self.rank)
        truncate = os.O_WRONLY | os.O_TRUNC  # never through a link (O_NOFOLLOW)
        self._stacks = open(open_own(path, flags=truncate), "w", encoding="utf-8")  # noqa: SIM115
        faulthandler.register(DUMP_SIGNAL, file=self._stacks, all_threads=True)

    def beat(self, step: int, phase: str, timed: bool = True, **extra: Any) -> None:
        now, self.step, self.timed = time.time(), step, timed
        record = {
            "rank": self.rank,
            "host": self.host,
            "pid": os.getpid(),
            "step": step,
            "phase": phase,
            "time": now,
            "timeout": self.timeout_s,
            "deadline": now + self.timeout_s if timed and self.timeout_s else None,
            **self.facts,
            **extra,
        }
        tmp = self.path.with_suffix(".tmp")
        # A file per step: opened O_NOFOLLOW (never written through a link planted at the name),
        # not replace_own's synced temporary (a crash only loses a beat).
        with open(open_own(tmp, flags=os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as f:
            f.write(json.dumps(record))
        tmp.replace(self.path)

    def before_step(self, step: int) -> None:
        if self.first is None:
            self.first = step  # warm-up: compilation, the first collectives, a resumed state
            self.beat(step - 1, "warmup", timed=False)
        elif not self.timed:
            self.beat(step - 1, "step")  # after a save: timed again
        # else the last step's beat set the deadline for this one: one write per step

    def after_step(self, step: int) -> None:
        saving = self.saves_after(step)
        self.beat(step, "save" if saving else "step", timed=not saving)

    def end(self, checkpoints: Checkpointer | None = None) -> None:
        """Training is over (the final save, the summary follow): no step deadline any more.
        From here each save of `checkpoints` says when this rank's part of it is done
        (SAVE_WRITTEN: its files written; rank 0's once the completion record is in place)."""
        self.facts["ended"] = True
        self.phase(FINAL_SAVE)
        if checkpoints is None:
            return
        pause, committed = checkpoints.before_marker, checkpoints.after_commit

        def before_marker(step: int) -> None:  # rank 0: the record is its part too
            self.phase(FINAL_SAVE)
            if pause is not None:
                pause(step)

        def after_commit(step: int, path: Path) -> None:
            if committed is not None:
                committed(step, path)
            self.phase(SAVE_WRITTEN)

        checkpoints.before_marker, checkpoints.after_commit = before_marker, after_commit
        checkpoints.rank_written = lambda: self.phase(SAVE_WRITTEN)

    def phase(self, name: str, allow_s: float = 0.0, **facts: Any) -> None:
        """A phase of the rank's end begins. `facts` stay in every later record; `allow_s`: how
        much longer than train.hang_timeout this phase may take once a peer has exited."""
        self.facts.update(facts)
        self.beat(self.step, name, timed=False, allow_s=allow_s)

    def exit(self, status: int) -> None:
        """The rank's last record, its process group gone: it exits with `status` now."""
        self.beat(self.step, EXIT_PHASE, timed=False, status=status)
        if self._stacks is not None:
            faulthandler.unregister(DUMP_SIGNAL)
            self._stacks.close()
            self._stacks = None


class Silent(Heartbeat):
    """No watchdog reads this rank (the in-process run): nothing written."""

    def __init__(self) -> None:
        self.step, self.facts = 0, {}

    def phase(self, name: str, allow_s: float = 0.0, **facts: Any) -> None:
        del name, allow_s, facts

    def beat(self, step: int, phase: str, timed: bool = True, **extra: Any) -> None:
        del step, phase, timed, extra

    def before_step(self, step: int) -> None:
        del step

    def after_step(self, step: int) -> None:
        del step

    def untimed_after(self, saves_after: Callable[[int], bool]) -> None:
        del saves_after

    def exit(self, status: int) -> None:
        del status


def start_heartbeat(cfg: RootConfig, run_dir: Path, rank: int) -> Heartbeat:
    """The rank's heartbeat (its stacks on SIGUSR2 too), from just after the process group is
    joined to the rank's exit; with no watchdog to read it (a rank not started by torchrun's
    agent: the in-process run) a Silent one. With train.hang_timeout=0 it is written with no
    deadlines (nothing is timed): `launch` still reads its phases (a SIGTERM once training is over,
    launcher/runners/signals.py). The last step is not timed (the final save follows);
    `untimed_after` adds the steps a checkpoint follows."""
    if AGENT_PID_ENV not in os.environ:
        return Silent()
    steps = cfg.train.steps
    heartbeat = Heartbeat(run_dir, rank, cfg.train.hang_timeout, lambda s: s >= steps)
    heartbeat.dump_stacks_on_signal()
    return heartbeat
