"""Every `#SBATCH` line the launcher writes, under one rule: a training job's train.sbatch and
verify.sbatch (launcher/runners/slurm.py), a job that runs after others (a sweep's summary,
launcher/runners/slurm_dependent.py) and a checkpoint's evaluation (launcher/harness/slurm_job.py).
Each caller says what differs (`SbatchJob`: its name, size, time, logs, dependency, requeue);
where the user may run (partition, account, qos) and a node's memory and features come from the
cluster config, the same for every job.

sbatch reads `#SBATCH` lines itself, not the shell: it splits them on blanks, stops at `#`, reads
quotes and backslashes its own way, and expands `%` in a log's name (`%j`, the job id). The rule:
every line is one long option, `--name` or `--name=value`, whose value holds no blank, quote,
`#`, backslash, `$`, backquote or control character (`is_directive`), and a directory the logs go
to holds no `%` either (the launcher adds its own `%j`). A value the user sets is checked against
it where it is defined (launcher/config/cluster.py), naming its key; the logs' directory here,
naming the key that chose it (hydra.run.dir, hydra.sweep.dir); and every line once more as it is
written. Values in a script's body are the callers' and are shell-quoted there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import ConfigError

if TYPE_CHECKING:
    from launcher.config.cluster import ClusterConfig

UNSAFE = re.compile(r"[\s'\"\\#$`\x00-\x1f\x7f]")
"""What no value on an #SBATCH line holds."""
_UNSAFE_LOG_DIR = re.compile(r"[\s'\"\\#$`%\x00-\x1f\x7f]")
_OPTION = re.compile(r"--[A-Za-z][A-Za-z0-9-]*")
_LOGS = ("--output", "--error")

MANAGED_DIRECTIVES = {
    "job-name": "cluster.job_name",
    "nodes": "parallel.nodes",
    "ntasks": "parallel.nodes (one task per node)",
    "ntasks-per-node": "parallel.dp (one task per node runs torchrun)",
    "gpus-per-node": "cluster.gpus_per_node",
    "cpus-per-task": "cluster.cpus_per_task",
    "mincpus": "cluster.cpus_per_task (per node in an elastic job)",
    "spread-job": "parallel.min_nodes (an elastic job spreads its tasks over the nodes)",
    "no-kill": "parallel.min_nodes (an elastic job goes on without a failed node)",
    "mem": "cluster.mem",
    "time": "cluster.time",
    "partition": "cluster.partition",
    "account": "cluster.account",
    "qos": "cluster.qos",
    "constraint": "cluster.constraint",
    "output": "the run directory (slurm-<job id>.out)",
    "error": "the run directory (slurm-<job id>.err)",
    "open-mode": "the run directory (logs are appended across requeues)",
    "signal": "cluster.signal_seconds",
    "requeue": "cluster.max_requeues",
    "no-requeue": "cluster.max_requeues=0",
    "wait": "cluster.wait",
    "array": "a sweep (`launch train -m`), which submits one job per point",
}
"""Options the launcher writes itself, and the setting that controls each."""


def is_directive(text: str) -> bool:
    """`--name` or `--name=value`, the value free of what sbatch would misread (the rule)."""
    name, equals, value = text.partition("=")
    if not _OPTION.fullmatch(name):
        return False
    return not equals or (bool(value) and UNSAFE.search(value) is None)


def check_directive_path(directory: Path, key: str) -> None:
    """A directory an #SBATCH line names (--output): sbatch cannot read some characters there."""
    bad = _UNSAFE_LOG_DIR.search(str(directory))
    if bad:
        raise ConfigError(
            key,
            f"{str(directory)!r} has {bad.group()!r}, which an #SBATCH line cannot hold.",
            "pick a directory without blanks, quotes, '#', '\\', '$', '`' or '%'.",
        )


def placement_options(cluster: ClusterConfig) -> list[str]:
    """Where this user may run (partition, account, qos): the same for every job the launcher
    submits (training, an evaluation, a sweep's summary)."""
    options = [
        f"--partition={cluster.partition}" if cluster.partition else None,
        f"--account={cluster.account}" if cluster.account else None,
        f"--qos={cluster.qos}" if cluster.qos else None,
    ]
    return [option for option in options if option is not None]


@dataclass(frozen=True)
class SbatchJob:
    """What one job asks SLURM for, beyond where the cluster config says it may run."""

    name: str
    """--job-name (cluster.job_name, with a suffix for a job beside the training)."""
    time: str
    """--time: its limit."""
    output: Path
    """--output: its log (`%j` in the name is the job id); stderr too unless `error`."""
    log_key: str
    """The config key that chose the logs' directory, for an error (hydra.run.dir, ...)."""
    size: tuple[str, ...] = ("--nodes=1", "--ntasks=1")
    """Nodes, tasks, GPUs and CPUs, in the order written."""
    error: Path | None = None
    """--error: stderr's own log."""
    node_resources: bool = True
    """A node's memory and features (cluster.mem, cluster.constraint) apply: a training or
    evaluation job; not a summary's few seconds on one CPU."""
    dependency: str | None = None
    """--dependency, e.g. afterany:12:13; afterok also cancels the job once it cannot run."""
    append_logs: bool = False
    """--open-mode=append: a requeued job continues its logs."""
    signal_seconds: int = 0
    """--signal=B:USR1@N: the batch script hears of the time limit N seconds before it."""
    requeue: bool = False
    """--requeue, else --no-requeue."""
    extra: tuple[str, ...] = ()
    """Further options, last (cluster.extra_directives)."""


def sbatch_directives(job: SbatchJob, cluster: ClusterConfig) -> str:
    """The job's #SBATCH lines, one option each, every value checked (the module's rule)."""
    for log in (job.output, job.error):
        if log is not None:
            check_directive_path(log.parent, job.log_key)
    features = job.node_resources
    options: list[str | None] = [
        f"--job-name={job.name}",
        f"--dependency={job.dependency}" if job.dependency else None,
        *job.size,
        f"--mem={cluster.mem}" if features and cluster.mem is not None else None,
        f"--time={job.time}",
        *placement_options(cluster),
        f"--constraint={cluster.constraint}" if features and cluster.constraint else None,
        f"--output={job.output}",
        f"--error={job.error}" if job.error is not None else None,
        "--open-mode=append" if job.append_logs else None,
        f"--signal=B:USR1@{job.signal_seconds}" if job.signal_seconds else None,
        "--requeue" if job.requeue else "--no-requeue",
        # afterok on a failed job can never run: cancelled, not left pending for ever.
        "--kill-on-invalid-dep=yes" if (job.dependency or "").startswith("afterok") else None,
        *job.extra,
    ]
    written = [option for option in options if option is not None]
    for option in written:
        _check_option(option, job)
    return "\n".join(f"#SBATCH {option}" for option in written)


def _check_option(option: str, job: SbatchJob) -> None:
    """The rule, once more, on a line about to be written; a value that breaks it names the
    setting that gave it."""
    if is_directive(option):
        return
    name = option.partition("=")[0]
    if name in _LOGS:
        key = job.log_key
    elif option in job.extra:
        key = f"cluster.extra_directives[{job.extra.index(option)}]"
    else:
        setting = MANAGED_DIRECTIVES.get(name[2:], "").split(" ")[0]
        key = setting if "." in setting else "cluster"
    raise ConfigError(
        key,
        f"{option!r} cannot be an #SBATCH line: sbatch would misread its blanks, quotes, '#', "
        "'\\', '$', '`' or control characters.",
        f"set {key} to a value without them.",
    )
