"""Where the job runs: this machine, SLURM, or several nodes that each run `launch` (torchrun).

Every SLURM value lands in train.sbatch. Values on `#SBATCH` lines are read by sbatch, which splits
on blanks and treats `#` and quotes specially, so they are checked against a strict pattern here;
values in the script body are also shell-quoted when rendered. One module writes every #SBATCH
line, under one rule: launcher/config/sbatch.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from launcher.config.checks import require_non_negative, require_positive
from launcher.config.sbatch import MANAGED_DIRECTIVES, is_directive
from launcher.errors import ConfigError
from launcher.rundir import SBATCH_FILE
from launcher.secrets import redactor_for


class ClusterKind(str, Enum):
    local = "local"
    slurm = "slurm"
    torchrun = "torchrun"


# sbatch --signal accepts at most 0xffff seconds.
MAX_SIGNAL_SECONDS = 65535

_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_LIST = re.compile(r"[A-Za-z0-9._,+-]{1,256}")  # partition, account, qos: names or a comma list
_CONSTRAINT = re.compile(r"[A-Za-z0-9._,&|*:()\[\]-]{1,256}")  # features: a100&ib, [rack1|rack2]
_MEM = re.compile(r"[0-9]+[KMGT]?")
_TIME = re.compile(r"(?:(?P<d>[0-9]+)-)?(?P<a>[0-9]+)(?::(?P<b>[0-9]+))?(?::(?P<c>[0-9]+))?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENDPOINT = re.compile(
    r"(?P<host>[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):(?P<port>[0-9]{1,5})"
)
_RDZV_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
ENDPOINT_EXAMPLE = "cluster.rdzv_endpoint=10.0.0.1:29500"


def time_limit_seconds(value: str) -> int:
    """SLURM's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    match = _TIME.fullmatch(value)
    if not match:
        raise ConfigError(
            "cluster.time",
            f"{value!r} is not a SLURM time limit.",
            "use [D-]HH:MM:SS, e.g. cluster.time=04:00:00 or cluster.time=2-00:00:00.",
        )
    days = int(match["d"] or 0)
    parts = [int(p) for p in (match["a"], match["b"], match["c"]) if p is not None]
    if match["d"] is not None:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:  # M or M:S
        hours, (minutes, seconds) = 0, [*parts, 0][:2]
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise ConfigError(
            "cluster.time", f"{value!r} is no time at all.", "set a positive time limit."
        )
    return total


def _check_pattern(key: str, value: str | None, pattern: re.Pattern[str], allowed: str) -> None:
    if value is not None and not pattern.fullmatch(value):
        raise ConfigError(
            key,
            "is empty."
            if not value
            else f"{value!r} has characters SLURM or the shell would misread.",
            f"give a value of {allowed}, or leave the key out."
            if not value
            else f"use only {allowed}.",
        )


def _check_directive(index: int, text: str) -> None:
    key = f"cluster.extra_directives[{index}]"
    if not is_directive(text):
        raise ConfigError(
            key,
            f"{text!r} is not a single long sbatch option.",
            "write one option per item as --name or --name=value, without blanks, quotes, '#', "
            "'\\', '$' or '`' (e.g. --exclusive, --gres=gpu:a100:4, --mail-user=me@example.org).",
        )
    name = text[2:].split("=", 1)[0]
    if name in MANAGED_DIRECTIVES:
        raise ConfigError(
            key, f"--{name} is written by the launcher.", f"set {MANAGED_DIRECTIVES[name]} instead."
        )


def split_endpoint(key: str, value: str) -> tuple[str, int]:
    """HOST:PORT -> (HOST, PORT), or one ConfigError naming `key` (a key or an environment
    variable) and the form it takes."""
    match = _ENDPOINT.fullmatch(value)
    port = int(match["port"]) if match else 0
    if match is None or not 1 <= port <= 65535:
        raise ConfigError(
            "cluster.rdzv_endpoint",
            f"{key}={value!r} is not HOST:PORT (a host name or address, a port 1-65535).",
            f"give the first node's address and a free port, e.g. {ENDPOINT_EXAMPLE}.",
        )
    return match["host"].strip("[]"), port


@dataclass
class ClusterConfig:
    """cluster=local runs here; cluster=slurm renders <run dir>/train.sbatch and submits it;
    cluster=torchrun: the same `launch train` on every node, joined at a c10d rendezvous."""

    name: ClusterKind = ClusterKind.local
    """local | slurm | torchrun."""
    job_name: str = "launcher"
    """slurm: job name (letters, digits, '-', '_', '.')."""
    partition: str | None = None
    """slurm: partition (null: the cluster's default)."""
    account: str | None = None
    """slurm: account to charge (null: your default account)."""
    qos: str | None = None
    """slurm: quality of service (null: the default)."""
    constraint: str | None = None
    """slurm: node features, e.g. a100&ib (null: any node)."""
    time: str = "01:00:00"
    """slurm: time limit, [D-]HH:MM:SS."""
    gpus_per_node: int = 0
    """slurm: GPUs per node (0 for CPU jobs); ranks per node must not exceed it."""
    cpus_per_task: int | None = None
    """slurm: CPUs for each node's task, shared by that node's ranks (null: the cluster's
    default)."""
    mem: str | None = None
    """slurm: memory per node, e.g. 64G; 0 means all of it (null: the cluster's default)."""
    signal_seconds: int = 120
    """slurm: USR1 this many seconds before the time limit, to checkpoint and requeue (0: none)."""
    max_requeues: int = 3
    """slurm: requeue a stopped job at most this many times (SLURM_RESTART_COUNT counts them)."""
    port: int | None = None
    """slurm: c10d rendezvous port on the first node (null: one free when the job starts, from
    29500 + job id % 1000 up, so that jobs sharing a node differ)."""
    wait: bool = False
    """slurm: wait for the job to end (sbatch --wait) and exit with its status."""
    python: str | None = None
    """slurm: the Python the nodes run (null: the one running `launch`; `python` if cluster.setup
    puts one on PATH)."""
    extra_directives: list[str] = field(default_factory=list)
    """slurm: further #SBATCH options, one --name=value per item, e.g. ['--exclusive']."""
    setup: list[str] = field(default_factory=list)
    """slurm: shell lines run before training (module load ..., source venv/bin/activate)."""
    rdzv_endpoint: str | None = None
    """torchrun: HOST:PORT of the c10d rendezvous, the same on every node (null: from the
    environment: PET_RDZV_ENDPOINT, PET_MASTER_ADDR:PET_MASTER_PORT, MASTER_ADDR:MASTER_PORT,
    SkyPilot's first node; docs/multinode.md)."""
    rdzv_id: str | None = None
    """torchrun: the job's name at the rendezvous, the same on every node (null: PET_RDZV_ID, else
    the run directory's name)."""
    node_rank: int | None = None
    """torchrun: this node's rank where an engine assigns them; node 0 hosts the rendezvous and
    writes the run directory (null: PET_NODE_RANK, NODE_RANK, SKYPILOT_NODE_RANK; else the node
    that holds the endpoint's port is node 0)."""
    rdzv_timeout: int = 600
    """torchrun: seconds to wait for every node at the rendezvous; then it ends naming the nodes
    that came and those that did not."""
    rdzv_last_call: int = 30
    """torchrun, elastic (parallel.min_nodes): seconds the rendezvous waits for more nodes once
    parallel.min_nodes have come, before it starts with those (torchrun's last_call_timeout)."""
    rdzv_keep_alive: int = 5
    """torchrun: seconds between each node's keep-alive at the rendezvous; a node silent for three
    of them is gone, and the others' restart goes on without it (torchrun's keep_alive_interval)."""

    def __post_init__(self) -> None:
        _check_pattern(
            "cluster.job_name",
            self.job_name,
            _NAME,
            "letters, digits, '.', '_' and '-' (at most 128)",
        )
        for key in ("partition", "account", "qos"):
            _check_pattern(
                f"cluster.{key}",
                getattr(self, key),
                _LIST,
                "letters, digits, '.', '_', '-', '+' and ','",
            )
        _check_pattern(
            "cluster.constraint",
            self.constraint,
            _CONSTRAINT,
            "feature names joined by & | , with [ ] ( ) *",
        )
        _check_pattern(
            "cluster.mem",
            self.mem,
            _MEM,
            "a number with an optional K, M, G or T suffix (e.g. 64G)",
        )
        limit = time_limit_seconds(self.time)
        require_non_negative("cluster.gpus_per_node", self.gpus_per_node)
        require_positive("cluster.cpus_per_task", self.cpus_per_task, allow_none=True)
        require_non_negative("cluster.signal_seconds", self.signal_seconds)
        require_non_negative("cluster.max_requeues", self.max_requeues)
        if self.signal_seconds > MAX_SIGNAL_SECONDS:
            raise ConfigError(
                "cluster.signal_seconds", f"SLURM allows at most {MAX_SIGNAL_SECONDS}.", "lower it."
            )
        if self.signal_seconds >= limit:
            raise ConfigError(
                ["cluster.signal_seconds", "cluster.time"],
                f"the stop signal {self.signal_seconds} s before the end would come before the job "
                f"starts ({self.time}).",
                "lower cluster.signal_seconds or raise cluster.time.",
            )
        if self.port is not None and not 1024 <= self.port <= 65535:
            raise ConfigError(
                "cluster.port", f"{self.port} is not a usable port.", "use 1024-65535, or null."
            )
        if self.python is not None and (not self.python or _CONTROL.search(self.python)):
            raise ConfigError(
                "cluster.python",
                "is empty or has control characters.",
                "give a path or a command name.",
            )
        if self.python is not None and "/" not in self.python and re.search(r"\s", self.python):
            raise ConfigError(
                "cluster.python",
                f"{self.python!r} is a command with arguments, but the nodes run it as one "
                "program's name (a path may hold a blank; a command name cannot).",
                "give the Python alone, e.g. cluster.python=python3 (options such as -X go in "
                "cluster.setup as environment variables, e.g. export PYTHONDEVMODE=1).",
            )
        if self.rdzv_endpoint is not None:
            split_endpoint("cluster.rdzv_endpoint", self.rdzv_endpoint)
        _check_pattern(
            "cluster.rdzv_id", self.rdzv_id, _RDZV_ID, "letters, digits, '.', '_' and '-'"
        )
        if self.node_rank is not None:
            require_non_negative("cluster.node_rank", self.node_rank)
        for key in ("rdzv_timeout", "rdzv_last_call", "rdzv_keep_alive"):
            require_positive(f"cluster.{key}", getattr(self, key))
        for i, directive in enumerate(self.extra_directives):
            _check_directive(i, directive)
        for i, line in enumerate(self.setup):
            if _CONTROL.search(line.replace("\t", " ")):
                raise ConfigError(
                    f"cluster.setup[{i}]",
                    "holds a newline or another control character.",
                    "give each shell line as its own list item.",
                )

    @property
    def schedules_jobs(self) -> bool:
        """A scheduler runs the jobs (cluster=slurm): a checkpoint's evaluation is a job of its
        own there, a process of the launcher's here (launcher/harness/dispatch.py)."""
        return self.name == ClusterKind.slurm


def refuse_secrets(cluster: ClusterConfig, script: str, name: str = SBATCH_FILE) -> None:
    """A credential (from the environment, or assigned in a setup line) must not reach the script
    file `name`."""
    secrets = redactor_for(script)
    if secrets.text(script) == script:
        return
    keys = [
        f"cluster.setup[{i}]" for i, line in enumerate(cluster.setup) if secrets.text(line) != line
    ]
    raise ConfigError(
        keys or ["cluster"],
        f"would write a credential into {name}.",
        "export it in the shell that runs `launch` instead: sbatch passes the environment to the "
        "job.",
    )
