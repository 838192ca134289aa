"""Rank-aware logging: rank 0 talks; other ranks speak only on warnings and errors, prefixed."""

from __future__ import annotations

import logging
import os
import sys
import time

from launcher.secrets import redact

LOGGER_NAME = "launcher"

TIMINGS_ENV = "LAUNCHER_TIMINGS"
"""Set to 1 (benchmarks/startup.py does): `launch` and every rank print `timing: <who> <phase>
<unix time> <process CPU seconds>` on stderr as they pass the points of start-up
(docs/development.md)."""


class _Formatter(logging.Formatter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        text = self.prefix + level + record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return redact(text)  # no credential reaches a console or a SLURM log file


def setup_logging(rank: int = 0) -> logging.Logger:
    log = logging.getLogger(LOGGER_NAME)
    log.handlers.clear()
    prefix = "" if rank == 0 else f"[rank {rank}] "
    # Progress and information on stdout; warnings and errors on stderr, from every rank.
    problems = logging.StreamHandler(sys.stderr)
    problems.setLevel(logging.WARNING)
    handlers: list[logging.Handler] = [problems]
    if rank == 0:
        info = logging.StreamHandler(sys.stdout)
        info.addFilter(lambda record: record.levelno < logging.WARNING)
        handlers.append(info)
    for handler in handlers:
        handler.setFormatter(_Formatter(prefix))
        log.addHandler(handler)
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False
    return log


def get_logger(name: str = "") -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}" if name else LOGGER_NAME)


def mark(phase: str) -> None:
    """With LAUNCHER_TIMINGS=1 in the environment, one line on stderr: this process's rank
    (`launch` for the launching process), the phase just reached, the wall-clock time and the
    CPU time this process has used. Otherwise nothing: the cost of one environment lookup."""
    if os.environ.get(TIMINGS_ENV) == "1":
        who = f"rank{os.environ['RANK']}" if "RANK" in os.environ else "launch"
        now, cpu = time.time(), time.process_time()
        sys.stderr.write(f"timing: {who} {phase} {now:.6f} {cpu:.6f}\n")  # one write: one line
        sys.stderr.flush()
