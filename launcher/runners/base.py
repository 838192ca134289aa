"""The Runner interface: one implementation per place a job runs (launcher/runners/__init__.py
chooses it from the config, once).

A runner adds its part to the plan (the command, the environment it adds, its run-directory
files) and later runs that plan. It never re-derives what the plan holds: `launch plan` prints
and writes exactly what `launch train` runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from launcher.config.root import RootConfig
from launcher.memory.machine import MachineMemory

if TYPE_CHECKING:
    from launcher.plan import Plan


class Runner(ABC):
    name: ClassVar[str]
    """plan.json's "runner": in-process | torchrun | slurm."""
    holds_run_lock: ClassVar[bool] = True
    """`launch` holds the run directory's lock while `run` runs (False: the job takes it)."""
    verifies_in_job: ClassVar[bool] = False
    """`launch train verify.first=true`: the job this runner submits certifies the split itself
    (True), or `launch` does before starting it (False)."""
    worker: str = "launcher.worker"
    """The module each rank runs (`python -m <worker> <run dir>/config.yaml`); `launch verify`
    sets launcher.verify.worker, which must also have `run_in_process(cfg, run_dir) -> int`."""

    launch_command: str = "train"
    """The `launch` subcommand this runner serves (train, or verify for its split): the command
    every node of a cluster=torchrun job runs (nodes.txt)."""

    first_node: bool = True
    """This process prepares the run directory (takes its lock, writes config.yaml and plan.json,
    clears the last attempt's marks); False: another node of the job does (cluster=torchrun)."""

    def resolve(self, cfg: RootConfig, run_dir: Path) -> RootConfig:
        """The config with what this runner reads from where it runs (cluster=torchrun: the
        rendezvous values from the environment); a bad or conflicting value raises ConfigError."""
        del run_dir
        return cfg

    def claim_run_dir(self, cfg: RootConfig, dry_run: bool) -> bool:
        """Decide whether this process is the one that prepares the run directory (sets
        `first_node`); `launch plan` (dry_run) always is, and joins nothing."""
        del cfg, dry_run
        return self.first_node

    def lock_holder(self) -> str | None:
        """What the run directory's lock names besides the process holding it (None: nothing)."""
        return None

    def check_environment(self, cfg: RootConfig) -> str | None:
        """Check that this machine can start the job; return the device type the ranks train on
        ("cpu" or "cuda") when this machine can tell, None when the job runs elsewhere."""
        del cfg
        return None

    def command(self, cfg: RootConfig, run_dir: Path) -> list[str]:
        """The command that starts the job (empty: it runs inside `launch`)."""
        del cfg, run_dir
        return []

    def environment(self, cfg: RootConfig) -> dict[str, str]:
        """Environment variables the command gets on top of this process's."""
        del cfg
        return {}

    def files(self, cfg: RootConfig, run_dir: Path) -> dict[str, str]:
        """Run-directory files the job needs (name -> text); a bad value raises ConfigError here."""
        del cfg, run_dir
        return {}

    def machine_memory(self, cfg: RootConfig) -> MachineMemory | None:
        """The memory the ranks train in (the memory plan's default budget); None when it is not
        known here."""
        del cfg
        return None

    def submit_verify(self, cfg: RootConfig, run_dir: Path) -> int | None:
        """`launch verify` where the ranks run elsewhere: submit the split's verification as a job
        of its own, wait for its certificate, return its exit status. None: the split runs from
        this machine (launcher/verify/command.py runs it)."""
        del cfg, run_dir
        return None

    def verify_runner(self) -> Runner | None:
        """The runner of `launch verify`'s split: None, the one its config chooses; itself where
        the split runs on the job's nodes, already met (cluster=torchrun)."""
        return None

    @abstractmethod
    def run(self, cfg: RootConfig, run_dir: Path, plan: Plan) -> int:
        """Start the job the plan describes (its files are written); its exit status."""
