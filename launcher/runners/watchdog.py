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
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from launcher.events import blamed_hang, read_events, record_event
from launcher.logs import get_logger
from launcher.rundir import HANG_REPORT_FILE, heartbeat_file, stacks_file
from launcher.runners.signals import worker_processes
from launcher.userpath.own import open_own
from launcher.worker.heartbeat import DUMP_SIGNAL

log = get_logger("watchdog")

DUMP_WAIT_S = 3.0
"""How long the ranks get to write their stacks after SIGUSR2."""
COLLECTIVE_MARKS = ("torch/distributed/", "torch/autograd/", "deepspeed/", " in _arrived")
"""The innermost frames of a rank's main thread in one of these: it waits in a collective (torch's
or DeepSpeed's, a backward's gradient all-reduce, the loop's step counts in
launcher/training/loss.py), i.e. for a peer."""
INNERMOST = 2


@dataclass
class Rank:
    rank: int
    proc: psutil.Process
    beat: dict[str, Any]

    @property
    def late_s(self) -> float:
        deadline = self.beat.get("deadline")
        return 0.0 if deadline is None else time.time() - float(deadline)

    def kernel_state(self) -> dict[str, str]:
        """What can be read of the process from outside: its state and where the kernel holds it."""
        found: dict[str, str] = {}
        with suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("State:"):
                    found["State"] = line.split(":", 1)[1].strip()
        with suppress(OSError):
            found["wchan"] = Path(f"/proc/{self.proc.pid}/wchan").read_text().strip() or "0"
        return found

    @property
    def stopped(self) -> bool:
        """Stopped (SIGSTOP, a debugger): it cannot write its own stack."""
        return self.kernel_state().get("State", "X")[:1] in ("T", "t")

    @property
    def dead(self) -> bool:
        """Exited (a zombie until its agent reaps it): a failure torchrun's agent handles, not a
        hang (e.g. a rank whose peer was just ended by another node's watchdog)."""
        return self.kernel_state().get("State", "X")[:1] in ("Z", "X")


def _rank_of(proc: psutil.Process) -> int | None:
    with suppress(psutil.Error, ValueError):
        return int(proc.environ().get("RANK", ""))
    return None


def _read_beat(path: Path) -> dict[str, Any] | None:
    with suppress(OSError, ValueError):
        beat = json.loads(path.read_text(encoding="utf-8"))
        return beat if isinstance(beat, dict) else None
    return None


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

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            try:
                ranks = self.ranks()
                if any(r.late_s > 0 for r in ranks):
                    self.fire(ranks)
            except Exception as exc:  # a watchdog must not end the job
                log.warning(f"hang watchdog: {type(exc).__name__}: {exc}")

    def ranks(self) -> list[Rank]:
        """This node's live ranks that report a heartbeat of their own."""
        found = []
        for proc in worker_processes():
            if proc.pid not in self._ranks:
                self._ranks[proc.pid] = _rank_of(proc)
            rank = self._ranks[proc.pid]
            beat = _read_beat(heartbeat_file(self.run_dir, rank)) if rank is not None else None
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
        if not blamed and _world_size(ranks) > len(ranks):
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
            f"progressing is on another node; stacks in {report}"
        )
        with open(open_own(report), "a", encoding="utf-8") as f:  # never through a link
            f.write(_report(line, ranks, blamed, stacks))
        self.hangs.append(
            record_event(
                self.run_dir,
                "hang",
                ranks=[r.rank for r in blamed],
                hosts=sorted({str(r.beat.get("host")) for r in blamed}),
                steps={r.rank: r.beat.get("step") for r in ranks},
                stopped=[r.rank for r in blamed if r.stopped],
                hang_timeout=timeout,
                report=str(report),
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


def _world_size(ranks: list[Rank]) -> int:
    with suppress(psutil.Error, ValueError):
        return int(ranks[0].proc.environ().get("WORLD_SIZE", "0"))
    return 0


def _wait_for_blame_elsewhere(run_dir: Path, done: threading.Event) -> None:
    deadline = time.monotonic() + PEER_WAIT_S
    while time.monotonic() < deadline and not done.wait(0.2):
        if blamed_hang(read_events(run_dir), time.time(), PEER_WAIT_S) is not None:
            return


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


def _report(line: str, ranks: list[Rank], blamed: list[Rank], stacks: dict[int, str]) -> str:
    out = [f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {line}", ""]
    for r in ranks:
        state = r.kernel_state()
        beat = r.beat
        tag = "  <-- no progress" if r in blamed else ""
        out.append(
            f"--- rank {r.rank} (pid {r.proc.pid} on {beat.get('host')}): last step "
            f"{beat.get('step')} ({beat.get('phase')}), {time.time() - float(beat['time']):.1f} s "
            f"ago; State: {state.get('State', '?')}, wchan: {state.get('wchan', '?')}{tag}"
        )
        if r.rank in stacks:
            out.append(stacks[r.rank].rstrip())
        elif r.stopped:
            out.append(
                "(stopped: a stopped process cannot write its own stack; the kernel's view is "
                "above. It was killed with the others.)"
            )
        else:
            out.append(f"(no stack written within {DUMP_WAIT_S:g} s of SIGUSR2)")
        out.append("")
    return "\n".join(out) + "\n"


def hang_exit_line(hangs: list[dict[str, Any]], code: int) -> str:
    last = hangs[-1]
    ranks = ", ".join(str(r) for r in last["ranks"])
    who = f"rank {ranks}" if ranks else "a rank on another node"
    return (
        f"the job hung ({who}, train.hang_timeout={last['hang_timeout']:g} s) and no "
        f"restart was left: exit {code}. Report: {last['report']}; a rerun resumes from the last "
        "complete checkpoint."
    )
