"""torchrun's agent inside this process, and who is to blame when a rank fails.

The local torchrun runner runs the agent in the `launch` process itself (no second Python
importing torch again), and each SLURM node's task (launcher/runners/slurm_node.py) runs it the
same way: `torch.distributed.run`'s own `parse_args` and `run`, with torchrun's arguments. The
ranks are then children of this process; each ties its life to it at start-up
(launcher/worker/__main__.py, `die_with_parent`), so that a kill -9 of this process never leaves
ranks training on.

When ranks fail, torchrun knows which one ended first and how (its exit status or signal); the
ranks' own error files (`error_rank<r>.txt`) say what the others then saw. `blame` puts the two
together: `rank 1 died first (SIGKILL, exit -9); rank 0 then failed: Connection closed by peer`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
from argparse import Namespace
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig
from torch.distributed.run import parse_args, run

from launcher.lifetime import AGENT_PID_ENV
from launcher.rundir import rank_error_files
from launcher.userpath import replace_own


def handles_signals_option() -> bool:
    """Whether this torch's torchrun takes --signals_to_handle (torch >= 2.8)."""
    return "signals_to_handle" in {f.name for f in dataclasses.fields(LaunchConfig)}


@dataclass(frozen=True)
class RankFailure:
    rank: int
    exitcode: int
    timestamp: int
    """Seconds since the epoch (torchrun's resolution)."""

    @property
    def signal(self) -> str | None:
        """The signal that ended the rank (SIGKILL, ...), None when it exited by itself."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"


def _blame_order(failure: RankFailure) -> int:
    """0: ended by a signal torchrun does not send (SIGKILL from outside, SIGSEGV, ...), never a
    consequence of a peer's failure; 1: exited by itself with an error (often a consequence: a
    peer's connection closed); 2: SIGTERM, the signal torchrun stops the surviving ranks with."""
    if failure.signal is None:
        return 1
    return 2 if failure.exitcode == -signal.SIGTERM else 0


def failures_of(exc: ChildFailedError) -> list[RankFailure]:
    """The failed ranks, the one most likely to have failed first first.

    torchrun's timestamps have whole seconds, and once one rank fails it stops the others with
    SIGTERM and records them as failed too. So the order is by cause (`_blame_order`), then time;
    `blame` refines ties with the ranks' error files, whose modification times are finer.
    """
    failures = [
        RankFailure(int(rank), failure.exitcode, int(failure.timestamp))
        for rank, failure in exc.failures.items()
    ]
    return sorted(failures, key=lambda f: (_blame_order(f), f.timestamp, f.rank))


class _DropReportedFailures(logging.Filter):
    """torchrun logs each failed rank and each rank it stops; `blame` says the same in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return not (text.startswith("failed (exitcode") or "closing signal" in text)


_ELASTIC_API_LOG = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
_ELASTIC_API_LOG.addFilter(_DropReportedFailures())


class _DropLostRendezvous(logging.Filter):
    """torchrun's warning that it could not close a rendezvous whose host (node 0) is gone:
    cluster=torchrun says that in one line (launcher/runners/torchrun_nodes.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "has failed to shutdown the rendezvous" not in record.getMessage()


logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous").addFilter(
    _DropLostRendezvous()
)


TORCHRUN_ENV_PREFIX = "PET_"
"""torchrun reads PET_<ARGUMENT> as the default of each argument it is not given."""


def parse_own_args(args: list[str]) -> Namespace:
    """torchrun's arguments as the launcher gives them, and nothing from PET_* variables (an
    engine's PET_NNODES would make a one-node agent wait for nodes the config never asked for):
    cluster=torchrun reads them itself (launcher/config/rendezvous.py)."""
    hidden = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(TORCHRUN_ENV_PREFIX)}
    try:
        return parse_args(args)
    finally:
        os.environ.update(hidden)


def run_agent(args: list[str]) -> list[RankFailure]:
    """Run torchrun with these arguments in this process (main thread); the failed ranks, first
    first, or [] when every rank ended with status 0."""
    from launcher.runners.rank_fork import forking_ranks

    os.environ[AGENT_PID_ENV] = str(os.getpid())
    worker = args[args.index("-m") + 1] if "-m" in args[:-1] else ""
    try:
        with forking_ranks() if worker.startswith("launcher.") else nullcontext():
            run(parse_own_args(args))
    except ChildFailedError as exc:
        return failures_of(exc)
    return []


def write_failures(path: Path, failures: list[RankFailure]) -> None:
    records = [{**dataclasses.asdict(f), "signal": f.signal} for f in failures]
    replace_own(path, json.dumps(records, indent=2) + "\n")


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except OSError:
        return "(no message)"
    return lines[-1] if lines else "(no message)"


def blame(failures: list[RankFailure], run_dir: Path | None) -> str:
    """One line: the rank that failed first and how, then what the others reported (their
    error files in the run directory)."""
    found = rank_error_files(run_dir) if run_dir is not None else []
    errors = {int(rank): path for rank, path in found if rank.isdigit()}

    def written_at(failure: RankFailure) -> float:
        path = errors.get(failure.rank)
        try:
            return path.stat().st_mtime if path is not None else float(failure.timestamp)
        except OSError:
            return float(failure.timestamp)

    failures = sorted(failures, key=lambda f: (_blame_order(f), written_at(f), f.rank))
    parts: list[str] = []
    told: set[int] = set()
    for i, failure in enumerate(failures):
        if failure.signal is not None:
            how = "died first" if i == 0 else "then died"
            parts.append(f"rank {failure.rank} {how} ({failure.signal}, exit {failure.exitcode})")
        else:
            how = "failed first" if i == 0 else "then failed"
            message = _last_line(errors[failure.rank]) if failure.rank in errors else ""
            parts.append(
                f"rank {failure.rank} {how} (exit {failure.exitcode})"
                + (f": {message}" if message else "")
            )
        told.add(failure.rank)
    for rank, path in sorted(errors.items()):
        if rank not in told:
            parts.append(f"rank {rank} then failed: {_last_line(path)}")
    traces = [str(path) for _, path in sorted(errors.items())]
    text = "; ".join(parts) or "a rank failed"
    return text + (f"  (tracebacks: {', '.join(traces)})" if traces else "")
