"""Shared helpers for tests that run the `launch` command or read a run directory."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from tests.cores import at_least, hold_at_least, ranks_started_by
from tests.served import LAUNCH as LAUNCH  # the command line of `launch`, for the tests
from tests.served import REPO, popen

# Small, fast settings for runs inside tests (the tiny model on the built-in task).
FAST = [
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=2",
    "data.eval_problems=16",
    "wandb.mode=disabled",
]
# The run that generate and serve tests read (tests/e2e/conftest.py: trained once per session):
# the tiny model, 20 steps, one rank, a DCP checkpoint at the end.
TRAINED = ["train", *FAST, "train.steps=20"]


def run_launch(
    args: list[str],
    run_dir: Path | None = None,
    *,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    check: bool = True,
    in_process: bool | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `launch <args>` (hydra.run.dir=run_dir when given) and return its output: in this
    process where tests/inprocess.py allows it (the same code without a Python start-up), else in
    a process of its own (tests/served.py: forked from a warm server, or a new interpreter).
    in_process=True: `env` matters to the ranks only (see runs_in_process). A deadline
    (timeout=) needs a process to kill when it passes: it runs in a process of its own (300 s
    when none is given)."""
    from tests.inprocess import completed, runs_in_process
    from tests.served import served_run

    args = [*args, *([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])]
    extra = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", **(env or {})}
    started = time.monotonic()
    with at_least(ranks_started_by(args)):
        if timeout is None and runs_in_process(args, env or {}, in_process):
            proc = completed(args, REPO, extra)
            how = "in-process"
        else:
            how = "subprocess"
            proc = served_run(
                args, REPO, {**os.environ, **extra}, 300 if timeout is None else timeout
            )
    log_launch(args, how, time.monotonic() - started)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"launch {' '.join(args)} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


LAUNCH_LOG_ENV = "LAUNCHER_TESTS_LAUNCH_LOG"
"""A file to which every launch a test starts appends one JSON line (the test, the command, how it
ran, the ranks it started, its seconds): counting a module's launches is how its cost is compared
on a machine too busy for its timings to mean much (docs/development.md, Tests)."""


def log_launch(args: list[str], how: str, seconds: float | None) -> None:
    path = os.environ.get(LAUNCH_LOG_ENV)
    if not path:
        return
    record = {
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
        "command": args[0] if args else "",
        "how": how,
        "ranks": ranks_started_by(args),
        "seconds": None if seconds is None else round(seconds, 2),
        "args": args,
    }
    with open(path, "a") as log:
        log.write(json.dumps(record) + "\n")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def read_losses(run_dir: Path) -> list[float]:
    return [m["loss"] for m in read_metrics(run_dir)]


def read_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def max_rel_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


class BackgroundLaunch:
    """`launch` started in the background, its output in a file (a full pipe never blocks it).

    own_session: start it as a shell job would, so a signal can go to its whole process group
    (a terminal's Ctrl-C, `kill -9 -PGID`) without reaching pytest.
    """

    def __init__(
        self,
        args: list[str],
        run_dir: Path,
        log_path: Path,
        env: dict[str, str],
        own_session: bool = False,
    ) -> None:
        self.run_dir = run_dir
        log_launch(args, "background", None)
        hold_at_least(ranks_started_by(args))
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log: IO[str] = open(log_path, "w")  # noqa: SIM115
        self.proc = popen(
            [*args, f"hydra.run.dir={run_dir}"],
            REPO,
            {**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            own_session=own_session,
        )

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def steps_logged(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.is_file() else 0

    def wait_for_step(self, step: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while self.steps_logged() < step:
            assert self.proc.poll() is None, (
                f"launch ended early ({self.proc.returncode}):\n{self.output}"
            )
            assert time.monotonic() < deadline, f"no step {step} in {timeout}s:\n{self.output}"
            time.sleep(0.05)

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:  # what it printed says where it waits
            raise AssertionError(f"launch still running after {timeout}s:\n{self.output}") from None
        finally:
            self._log.close()


def rank_number(proc: Any) -> int | None:
    """The global rank of a launcher rank process (a psutil.Process), None for any other process:
    an exec'd rank (`python -m launcher.worker`, RANK in its environment) or one forked by its
    agent (named `rank<N>`, its parent not: launcher/runners/rank_fork.py; a process the rank
    forks in turn inherits the name)."""
    import psutil

    try:
        name = proc.name()
        if name.startswith("rank") and name[4:].isdigit():
            parent = proc.parent()
            inherited = parent is not None and parent.name() == name
            return None if inherited else int(name[4:])
        if "launcher.worker" in " ".join(proc.cmdline()):
            rank = proc.environ().get("RANK")
            return int(rank) if rank is not None else None
    except (psutil.Error, ValueError):
        return None
    return None


def rank_process(root_pid: int, rank: int) -> Any:
    """The process of global rank `rank` among `root_pid`'s descendants (launch -> ranks)."""
    import psutil

    for proc in psutil.Process(root_pid).children(recursive=True):
        if rank_number(proc) == rank:
            return proc
    raise AssertionError(f"no rank {rank} under pid {root_pid}")
