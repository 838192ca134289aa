"""The ranks the hang watchdog (launcher/runners/watchdog.py) watches, as it sees them from
outside: the process, its latest heartbeat record (launcher/worker/heartbeat.py), what the kernel
says of it; and the hang report's text."""

from __future__ import annotations

import json
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from launcher.rundir import heartbeat_files

DUMP_WAIT_S = 3.0
"""How long the ranks get to write their stacks after SIGUSR2."""


@dataclass
class Rank:
    rank: int
    proc: psutil.Process
    beat: dict[str, Any]

    @property
    def late_s(self) -> float:
        deadline = self.beat.get("deadline")
        return 0.0 if deadline is None else time.time() - float(deadline)

    @property
    def ended(self) -> bool:
        """Past its training: the final save, evaluation, tracker, teardown, exit."""
        return bool(self.beat.get("ended"))

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


def rank_variables(proc: psutil.Process) -> dict[str, str]:
    """A rank's torchrun variables (RANK, WORLD_SIZE, ...): a forked rank's from its parent's
    record (launcher/runners/rank_fork.py), an exec'd one's from its environment."""
    from launcher.runners.rank_fork import rank_environment

    return rank_environment(proc.pid) or proc.environ()


def rank_of(proc: psutil.Process) -> int | None:
    with suppress(psutil.Error, ValueError):
        return int(rank_variables(proc).get("RANK", ""))
    return None


def world_size_of(proc: psutil.Process) -> int:
    with suppress(psutil.Error, ValueError):
        return int(rank_variables(proc).get("WORLD_SIZE", "0"))
    return 0


def read_beat(path: Path) -> dict[str, Any] | None:
    with suppress(OSError, ValueError):
        beat = json.loads(path.read_text(encoding="utf-8"))
        return beat if isinstance(beat, dict) else None
    return None


def report_text(line: str, ranks: list[Rank], blamed: list[Rank], stacks: dict[int, str]) -> str:
    """One entry of hang_report.txt: the line, then each rank of this node with its stack."""
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


def attempt_started(live: list[Rank]) -> float:
    """When this attempt's ranks started: exits recorded before are an earlier attempt's."""
    times = []
    for r in live:
        with suppress(psutil.Error):
            times.append(r.proc.create_time())
    return min(times, default=time.time())


def attempt_beats(run_dir: Path, live: list[Rank], phase: str) -> list[dict[str, Any]]:
    """This attempt's progress records in `phase`, any node's (the run directory is shared)."""
    since = attempt_started(live)
    beats = (read_beat(path) for path in heartbeat_files(run_dir))
    return [
        b
        for b in beats
        if b is not None and b.get("phase") == phase and float(b.get("time", 0)) >= since
    ]


def late_elsewhere(run_dir: Path, live: list[Rank]) -> str:
    """For a node whose ranks all wait in a collective: the other nodes' ranks of this attempt
    whose heartbeat is past its deadline (the shared run directory holds every rank's), as
    ': rank 1 on node-b (last at step 5)'; '' when none is (their node's watchdog names them).
    A node frozen whole (SIGSTOP, a paused VM) has no watchdog left to name its ranks."""
    mine, since, now = {r.rank for r in live}, attempt_started(live), time.time()
    late = []
    for path in heartbeat_files(run_dir):
        beat = read_beat(path)
        if beat is None or beat.get("rank") in mine or float(beat.get("time", 0)) < since:
            continue
        if beat.get("deadline") is not None and now > float(beat["deadline"]):
            late.append(
                f"rank {beat.get('rank')} on {beat.get('host')} (last at step {beat.get('step')})"
            )
    return f": {', '.join(late)}" if late else ""
