"""Where the suite's time goes: each test's wall time, CPU time and core-token time, per worker.

`LAUNCHER_TEST_PROFILE=FILE make test` (or scripts/test.sh) has every xdist worker append one
JSON line per test to FILE: its wall seconds, the CPU seconds of the worker and of the processes
it started and reaped (`launch`, its ranks; a SLURM job's are the cluster's, not counted), the
token-seconds it held (tests/cores.py) and the seconds it waited for tokens. Then

    .venv/bin/python -m tests.suite_profile FILE

prints the totals and the tests that held the most token-seconds without using them: the waits
that kept other workers' tests from running.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.cores import Cores
from tests.served import CPU_SECONDS

FILE_ENV = "LAUNCHER_TEST_PROFILE"


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    served = CPU_SECONDS[0]  # launches forked by tests/launch_server.py, not this process's
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + served


@contextmanager
def recorded(nodeid: str, found: Cores) -> Iterator[None]:
    """One line for this test in $LAUNCHER_TEST_PROFILE (nothing without it)."""
    target = os.environ.get(FILE_ENV)
    if not target:
        yield
        return
    wall, cpu = time.monotonic(), _cpu_seconds()
    tokens, waited = found.token_seconds, found.wait_seconds
    try:
        yield
    finally:
        line = {
            "test": nodeid,
            "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
            "start": time.time() - (time.monotonic() - wall),
            "wall": time.monotonic() - wall,
            "cpu": _cpu_seconds() - cpu,
            "token_s": found.token_seconds - tokens,
            "wait_s": found.wait_seconds - waited,
        }
        with open(target, "a") as out:  # one short append per line: workers do not interleave
            out.write(json.dumps(line) + "\n")


@dataclass(frozen=True)
class Line:
    test: str
    worker: str
    start: float
    wall: float
    cpu: float
    token_s: float
    wait_s: float


def summary(lines: list[Line], top: int = 20) -> str:
    span = max(x.start + x.wall for x in lines) - min(x.start for x in lines) if lines else 1.0
    cpu, cores = sum(x.cpu for x in lines), len(os.sched_getaffinity(0))  # as scripts/test.sh
    out = [
        f"{len(lines)} tests over {span:.0f} s: {cpu:.0f} CPU-s ({cpu / span / cores:.0%} of "
        f"{cores} cores), {sum(x.token_s for x in lines):.0f} token-s held, "
        f"{sum(x.wait_s for x in lines):.0f} s waited for tokens",
        f"\nheld without use (token-s - CPU-s), the top {top}:",
    ]
    for x in sorted(lines, key=lambda x: x.cpu - x.token_s)[:top]:
        out.append(f"{x.token_s - x.cpu:7.0f}  wall {x.wall:5.0f}  cpu {x.cpu:5.0f}  {x.test}")
    out.append(f"\nby module, the top {top} in CPU-s (tests, wall s, token-s held):")
    modules: dict[str, list[Line]] = {}
    for x in lines:
        modules.setdefault(x.test.split("::")[0], []).append(x)
    for name, group in sorted(modules.items(), key=lambda kv: -sum(x.cpu for x in kv[1]))[:top]:
        cpu_s, wall_s = sum(x.cpu for x in group), sum(x.wall for x in group)
        held = sum(x.token_s for x in group)
        out.append(f"{cpu_s:7.0f}  {len(group):4d}  {wall_s:6.0f}  {held:6.0f}  {name}")
    out.append(f"\nwaited for tokens, the top {top}:")
    for x in sorted(lines, key=lambda x: -x.wait_s)[:top]:
        out.append(f"{x.wait_s:7.0f}  {x.worker}  {x.test}")
    return "\n".join(out)


if __name__ == "__main__":
    text = Path(sys.argv[1]).read_text()
    print(summary([Line(**json.loads(row)) for row in text.splitlines() if row]))
