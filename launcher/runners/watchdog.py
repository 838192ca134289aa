"""The hang watchdog: a thread beside torchrun's agent (in `launch`, or a SLURM node's task) that
reads this node's ranks' heartbeats (launcher/worker/heartbeat.py) and ends a job whose rank has
made no progress for train.hang_timeout.

It lives outside the ranks, so it works whatever state a rank is in: stopped (SIGSTOP), wedged in
a read, or waiting in a collective for a peer that never comes. When a rank's deadline passes:

1. every rank of this node that can still run gets SIGUSR2 and writes the Python stacks of all
   its threads (faulthandler); a stopped or dead one cannot, and the report shows what the
   kernel says of it instead (/proc/PID/status State, wchan);
2. the rank to blame is named: a stopped one, else one whose stack is not in a collective
   (torch.distributed), else the one late longest;
3. hang_report.txt gets the names and every stack, events.jsonl a record, the log one line;
4. the node's ranks are killed (SIGKILL, which also ends a stopped one), so torchrun restarts them
   from the newest checkpoint where train.max_restarts allows, or the job ends with HUNG.

It watches a rank's whole life, from its first step to its exit: at the end of a run (final
save, evaluation, tracker, teardown) no phase has a deadline of its own, but once one rank has
exited cleanly the others get train.hang_timeout (launcher/runners/held.py): the same report, and
when the run's work is complete and saved the agent ends at once and the job exits COMPLETE_HELD.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from launcher.events import blamed_hang, read_events, record_event
from launcher.logs import get_logger
from launcher.rundir import HANG_REPORT_FILE, heartbeat_file, stacks_file
from launcher.runners.hang_ranks import (
    DUMP_WAIT_S,
    Rank,
    attempt_started,
    late_elsewhere,
    rank_of,
    read_beat,
    report_text,
    world_size_of,
)
from launcher.runners.held import Held, held_line, held_ranks
from launcher.runners.held_save import held_in_save
from launcher.runners.signals import worker_processes
from launcher.userpath.own import open_own
from launcher.worker.heartbeat import DUMP_SIGNAL

log = get_logger("watchdog")

END_AGENT_SIGNAL = signal.SIGUSR2
"""Sent by the watchdog to its own process's main thread (torchrun's agent runs there) to end the
agent without a restart, once it ended the ranks that held a complete run."""
COLLECTIVE_MARKS = ("torch/distributed/", "torch/autograd/", "deepspeed/", " in _arrived")
"""The innermost frames of a rank's main thread in one of these: it waits in a collective (torch's
or DeepSpeed's, a backward's gradient all-reduce, the loop's step counts in
launcher/training/loss.py), i.e. for a peer."""
INNERMOST = 2


class AgentEnded(BaseException):
    """Raised in the agent's thread once the ranks that held a complete run are ended: torchrun's
    agent shuts down (no restart); the Watchdog's `with` block ends there. A BaseException, so
    that no `except Exception` on the way swallows it."""


class Watchdog:
    """`with Watchdog(run_dir) as watchdog:` around the agent; `watchdog.hangs` lists what it found.

    It watches only ranks that are this process's children and whose heartbeat names their pid,
    so heartbeat files of other nodes or earlier attempts never count.
    """

    def __init__(self, run_dir: Path, poll_s: float = 0.5) -> None:
        self.run_dir, self.poll_s = run_dir, poll_s
        self.hangs: list[dict[str, Any]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)
        self._ranks: dict[int, int | None] = {}  # pid -> rank (read once per process)
        self._ending = False
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None

    def __enter__(self) -> Watchdog:
        if threading.current_thread() is threading.main_thread():  # where the agent runs
            self._previous = signal.signal(END_AGENT_SIGNAL, self._end_agent)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> bool:
        try:
            self._done.set()
            self._thread.join()
        except AgentEnded:
            pass  # the agent had ended by itself
        finally:
            if self._previous is not None:
                signal.signal(END_AGENT_SIGNAL, self._previous)
        return exc_type is not None and issubclass(exc_type, AgentEnded)

    @property
    def held_complete(self) -> dict[str, Any] | None:
        """The record of a rank that held a run whose work was complete and saved."""
        last = self.hangs[-1] if self.hangs else None
        return last if last is not None and last.get("complete") else None

    def _end_agent(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        if self._ending:
            self._ending = False
            raise AgentEnded

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            try:
                ranks = self.ranks()
                if any(r.late_s > 0 for r in ranks):
                    self.fire(ranks)
                elif (held := held_ranks(self.run_dir, ranks) or self.in_save(ranks)) is not None:
                    self.fire_held(ranks, held)
            except Exception as exc:  # a watchdog must not end the job
                log.warning(f"hang watchdog: {type(exc).__name__}: {exc}")

    def in_save(self, ranks: list[Rank]) -> Held | None:
        return held_in_save(self.run_dir, ranks, time.time())

    def ranks(self) -> list[Rank]:
        """This node's live ranks that report a heartbeat of their own."""
        found = []
        for proc in worker_processes():
            if proc.pid not in self._ranks:
                self._ranks[proc.pid] = rank_of(proc)
            rank = self._ranks[proc.pid]
            beat = read_beat(heartbeat_file(self.run_dir, rank)) if rank is not None else None
            if rank is not None and beat is not None and beat.get("pid") == proc.pid:
                candidate = Rank(rank, proc, beat)
                if candidate.dead:
                    return []  # the node's ranks are ending: the agent restarts or stops them
                found.append(candidate)
                timeout = float(beat.get("timeout") or 0)
                if timeout:
                    self.poll_s = max(0.1, min(2.0, timeout / 10))
        return sorted(found, key=lambda r: r.rank)

    def fire(self, ranks: list[Rank]) -> None:
        stacks = self._dump_stacks(ranks)
        blamed = _blame(ranks, stacks)
        several_nodes = world_size_of(ranks[0].proc) > len(ranks)
        named = blamed_hang(read_events(self.run_dir), time.time(), PEER_WAIT_S) or {"time": 0}
        if several_nodes and float(named["time"]) >= attempt_started(ranks) > 0:
            # Another node named its rank in this attempt: these were failing with their peer.
            blamed = [r for r in blamed if r.stopped or r.rank in named["ranks"]]
        if not blamed and several_nodes:
            # All wait for a peer on another node: let that node's watchdog name the rank first
            # (ending these ranks would end the job there before it could).
            _wait_for_blame_elsewhere(self.run_dir, self._done)
        late = max(ranks, key=lambda r: r.late_s)
        timeout = float(late.beat.get("timeout") or 0)
        names = ", ".join(f"rank {r.rank} on {r.beat.get('host')}" for r in blamed)
        how = "stopped" if any(r.stopped for r in blamed) else "no progress"
        report = self.run_dir / HANG_REPORT_FILE
        line = (
            f"hang: {names} ({how}) made no progress for {timeout:g} s (train.hang_timeout), "
            f"last at step {min(int(r.beat.get('step', 0)) for r in blamed)}; "
            f"stacks of {len(ranks)} rank(s) in {report}"
            if blamed
            else f"hang: no progress for {timeout:g} s (train.hang_timeout) on this node's "
            f"{len(ranks)} rank(s), all waiting in a collective: the rank that stopped "
            f"progressing is on another node{late_elsewhere(self.run_dir, ranks)}; stacks in "
            f"{report}"
        )
        self._end(line, ranks, blamed, stacks, hang_timeout=timeout)

    def fire_held(self, ranks: list[Rank], held: Held) -> None:
        """Ranks still running past their time after a peer exited cleanly: named with their
        stacks, ended; when the run's work is complete and saved, the agent too (no restart)."""
        stacks = self._dump_stacks(ranks)
        how = {r.rank: "stopped" if r.stopped else "no exit" for r in held.late}
        line = held_line(held, how, self.run_dir / HANG_REPORT_FILE)
        complete = held.complete
        self._end(
            line,
            ranks,
            held.late,
            stacks,
            hang_timeout=float(held.late[0].beat.get("timeout") or 0),
            after_exit_of=[e.get("rank") for e in held.exited],
            phases={r.rank: r.beat.get("phase") for r in held.late},
            complete=complete,
            final_checkpoint=held.final_checkpoint,
            checkpoints=held.checkpoints,
            since=attempt_started(ranks),
        )
        if complete and self._previous is not None:
            self._ending = True  # the agent would restart the ranks: end it instead
            signal.pthread_kill(threading.main_thread().ident or 0, END_AGENT_SIGNAL)

    def _end(
        self,
        line: str,
        ranks: list[Rank],
        blamed: list[Rank],
        stacks: dict[int, str],
        **facts: Any,
    ) -> None:
        """The report, the event, the log's line; then this node's ranks are killed."""
        report = self.run_dir / HANG_REPORT_FILE
        with open(open_own(report), "a", encoding="utf-8") as f:  # never through a link
            f.write(report_text(line, ranks, blamed, stacks))
        self.hangs.append(
            record_event(
                self.run_dir,
                "hang",
                ranks=[r.rank for r in blamed],
                hosts=sorted({str(r.beat.get("host")) for r in blamed}),
                steps={r.rank: r.beat.get("step") for r in ranks},
                stopped=[r.rank for r in blamed if r.stopped],
                report=str(report),
                **facts,
            )
        )
        log.error(line + "; ending this node's ranks.")
        for r in ranks:
            with suppress(psutil.Error):
                r.proc.kill()

    def _dump_stacks(self, ranks: list[Rank]) -> dict[int, str]:
        """SIGUSR2 to every rank that can run; what each wrote (faulthandler) within a moment."""
        offsets: dict[int, int] = {}
        for r in ranks:
            if r.stopped:
                continue
            path = stacks_file(self.run_dir, r.rank)
            offsets[r.rank] = path.stat().st_size if path.exists() else 0
            with suppress(ProcessLookupError):
                os.kill(r.proc.pid, DUMP_SIGNAL)
        # A dump is whole once its file stops growing (faulthandler writes it in one go).
        sizes: dict[int, int] = {}
        done: set[int] = set()
        deadline = time.monotonic() + DUMP_WAIT_S
        while offsets.keys() - done and time.monotonic() < deadline:
            time.sleep(0.2)
            for rank, offset in offsets.items():
                with suppress(OSError):
                    size = stacks_file(self.run_dir, rank).stat().st_size
                    if size > offset and sizes.get(rank) == size:
                        done.add(rank)
                    sizes[rank] = size
        stacks: dict[int, str] = {}
        for rank, offset in offsets.items():
            with suppress(OSError), open(stacks_file(self.run_dir, rank), "rb") as f:
                f.seek(offset)
                text = f.read().decode("utf-8", "replace")
                if text.strip():
                    stacks[rank] = text
        return stacks


PEER_WAIT_S = 10.0
"""How long a node whose ranks all wait for a peer gives the other nodes' watchdogs to name it."""


PEER_POLL_S = 0.2


def _wait_for_blame_elsewhere(
    run_dir: Path, done: threading.Event, clock: Callable[[], float] = time.monotonic
) -> bool:
    """Whether another node's record named the rank within PEER_WAIT_S (by `clock`)."""
    deadline = clock() + PEER_WAIT_S
    while clock() < deadline and not done.wait(PEER_POLL_S):
        if blamed_hang(read_events(run_dir), time.time(), PEER_WAIT_S) is not None:
            return True
    return False


def _in_collective(stack: str) -> bool:
    """Whether the main thread's innermost frames are a wait for peers (faulthandler names the
    thread that took the signal, the main thread, "Current thread")."""
    _, found, main = stack.partition("Current thread")
    frames = [ln for ln in (main if found else stack).splitlines() if ln.strip().startswith("File")]
    return any(mark in frame for frame in frames[:INNERMOST] for mark in COLLECTIVE_MARKS)


def _blame(ranks: list[Rank], stacks: dict[int, str]) -> list[Rank]:
    stopped = [r for r in ranks if r.stopped]
    if stopped:
        return stopped
    off_collective = [r for r in ranks if r.rank in stacks and not _in_collective(stacks[r.rank])]
    if off_collective:
        return off_collective
    if len(stacks) == len(ranks):
        return []  # all of them wait for a peer elsewhere
    return [r for r in ranks if r.rank not in stacks] or [max(ranks, key=lambda r: r.late_s)]
