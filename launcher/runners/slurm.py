"""cluster=slurm: render <run dir>/train.sbatch from slurm/train.sbatch, and submit it with sbatch.

The #SBATCH lines are written and checked by launcher/config/sbatch.py (the one writer of them)
from what this job asks for; values in the script body are shell-quoted. The environment is
never copied into the script: sbatch passes the submitting shell's environment to the job (its
default --export=ALL), so credentials reach the job without being written to disk.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.config.cluster import refuse_secrets
from launcher.config.root import RootConfig
from launcher.config.sbatch import SbatchJob, check_directive_path, sbatch_directives
from launcher.errors import ConfigError, EnvironmentProblem
from launcher.exit_codes import FAILED, STOPPED_RESUMABLE
from launcher.logs import get_logger
from launcher.memory.machine import MachineMemory
from launcher.resources import sbatch_template
from launcher.rundir import (
    CERTIFICATE_FILE,
    SBATCH_FILE,
    STOPPED_FILE,
    VERIFY_SBATCH_FILE,
    slurm_logs,
    write_slurm_job,
)
from launcher.runners.base import Runner
from launcher.runners.slurm_nodes import cpus_option, elastic_values, node_options
from launcher.runners.slurm_verify import verify_step
from launcher.userpath import replace_own

if TYPE_CHECKING:
    from launcher.plan import Plan

log = get_logger("slurm")

TEMPLATE = sbatch_template()  # slurm/train.sbatch, in the checkout or the installed package
DEFAULT_PORT = '$("$PYTHON" -m launcher.runners.ports "$SLURM_JOB_ID")'
"""cluster.port=null: a port per job, free when the job starts, so that two jobs sharing a first
node do not collide (from 29500 + job id % 1000 up: launcher/runners/ports.py)."""

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_MEM = re.compile(r"^(\d+)([KMGT]?)$")
_MEM_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "": 2**20}  # --mem: MiB by default


def check_slurm(cfg: RootConfig, run_dir: Path) -> None:
    """Checks that need the whole config and the run directory; raise before anything is written."""
    cluster, per_node = cfg.cluster, cfg.parallel.ranks_per_node
    check_directive_path(run_dir, "hydra.run.dir")
    if cluster.gpus_per_node and per_node > cluster.gpus_per_node:
        raise ConfigError(
            ["parallel.dp", "parallel.nodes", "cluster.gpus_per_node"],
            f"{per_node} ranks per node but {cluster.gpus_per_node} GPU(s) per node.",
            f"set cluster.gpus_per_node={per_node}, or more nodes or fewer ranks.",
        )
    if cfg.train.device == "cuda" and not cluster.gpus_per_node:
        raise ConfigError(
            ["train.device", "cluster.gpus_per_node"],
            "train.device=cuda, but the job asks SLURM for no GPU.",
            f"set cluster.gpus_per_node={per_node} (one per rank).",
        )


def _directives(cfg: RootConfig, run_dir: Path) -> str:
    """The training job: its nodes, GPUs and CPUs, the cluster's time, logs appended across
    requeues, the stop signal before the time limit, requeued while cluster.max_requeues."""
    cluster = cfg.cluster
    out, err = slurm_logs(run_dir)
    size = [
        *node_options(cfg),
        f"--gpus-per-node={cluster.gpus_per_node}" if cluster.gpus_per_node else None,
        cpus_option(cfg),
    ]
    job = SbatchJob(
        name=cluster.job_name,
        time=cluster.time,
        output=out,
        error=err,
        log_key="hydra.run.dir",
        size=tuple(option for option in size if option is not None),
        append_logs=True,
        signal_seconds=cluster.signal_seconds,
        requeue=bool(cluster.max_requeues),
        extra=tuple(cluster.extra_directives),
    )
    return sbatch_directives(job, cluster)


def _fill(template: str, values: dict[str, str]) -> str:
    missing = set(_PLACEHOLDER.findall(template)) ^ set(values)
    if missing:
        raise RuntimeError(f"{TEMPLATE}: placeholders and values differ: {sorted(missing)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _verify_step(cfg: RootConfig, verify_only: bool) -> str:
    """verify.first (or `launch verify`): the split's certificate, in the allocation, before the
    training step; nothing (the default script unchanged) otherwise."""
    if not (verify_only or cfg.verify.first):
        return ""
    return verify_step(verify_only)


def render_sbatch(cfg: RootConfig, run_dir: Path, verify_only: bool = False) -> str:
    """The text of train.sbatch for this run (what `launch plan` shows and `launch train`
    submits); verify_only: verify.sbatch of `launch verify`, which ends after the certificate."""
    run_dir = run_dir.resolve()
    check_slurm(cfg, run_dir)
    cluster = cfg.cluster
    script_name = VERIFY_SBATCH_FILE if verify_only else SBATCH_FILE
    values = {
        "banner": (
            "Rendered by `launch` from slurm/train.sbatch; change the config, not this file. "
            f"Resubmit: sbatch {shlex.quote(str(run_dir / script_name))}"
        ),
        "directives": _directives(cfg, run_dir),
        "run_dir": shlex.quote(str(run_dir)),
        "python": shlex.quote(cluster.python or sys.executable),
        "ranks_per_node": str(cfg.parallel.ranks_per_node),
        "port": str(cluster.port) if cluster.port is not None else DEFAULT_PORT,
        "max_restarts": str(cfg.restarts),
        "max_requeues": str(cluster.max_requeues),
        "stopped_resumable": str(STOPPED_RESUMABLE),
        "stopped_file": shlex.quote(STOPPED_FILE),
        "setup": "\n".join(cluster.setup) if cluster.setup else "# (none)",
        "verify_first": _verify_step(cfg, verify_only),
        **elastic_values(cfg),
    }
    script = _fill(TEMPLATE.read_text(encoding="utf-8"), values)
    refuse_secrets(cfg.cluster, script)
    return script


def sbatch_argv(cfg: RootConfig, run_dir: Path) -> list[str]:
    """The submission command. Checks the run directory and the cluster first, so a bad value
    fails before any file is written."""
    check_slurm(cfg, run_dir.resolve())
    wait = ["--wait"] if cfg.cluster.wait else []
    return ["sbatch", "--parsable", *wait, str(run_dir.resolve() / SBATCH_FILE)]


class SlurmRunner(Runner):
    """The plan's train.sbatch (rendered once, into the plan) is submitted with sbatch."""

    name = "slurm"
    holds_run_lock = False  # the job's first node takes it (launcher/runners/slurm_node.py)
    verifies_in_job = True  # verify.first: train.sbatch certifies the split in the allocation

    def machine_memory(self, cfg: RootConfig) -> MachineMemory | None:
        """A node's cluster.mem shared by its ranks, on CPU; None on GPUs (unseen from here),
        without cluster.mem, or with cluster.mem=0 (all of a node's, unknown here)."""
        match = _MEM.match(cfg.cluster.mem or "")
        if cfg.cluster.gpus_per_node or match is None or int(match.group(1)) == 0:
            return None
        mem = int(match.group(1)) * _MEM_UNITS[match.group(2)]
        return mem, cfg.parallel.ranks_per_node, f"cluster.mem={cfg.cluster.mem} per node"

    def command(self, cfg: RootConfig, run_dir: Path) -> list[str]:
        return sbatch_argv(cfg, run_dir)

    def files(self, cfg: RootConfig, run_dir: Path) -> dict[str, str]:
        return {SBATCH_FILE: render_sbatch(cfg, run_dir)}

    def run(self, cfg: RootConfig, run_dir: Path, plan: Plan) -> int:
        return submit(cfg, run_dir, plan.command)

    def submit_verify(self, cfg: RootConfig, run_dir: Path) -> int:
        """Write verify.sbatch, submit it and wait for the job: the split runs in the allocation,
        the certificate is written on its batch host."""
        path = run_dir.resolve() / VERIFY_SBATCH_FILE
        replace_own(path, render_sbatch(cfg, run_dir, verify_only=True), bits=0o755)
        waiting = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, wait=True))
        code = submit(waiting, run_dir, ["sbatch", "--parsable", "--wait", str(path)])
        certificate = run_dir / CERTIFICATE_FILE
        if certificate.is_file():
            data = json.loads(certificate.read_text(encoding="utf-8"))
            verdict = "certified" if data["certified"] else "NOT certified"
            get_logger("verify").info(f"{verdict}; the certificate: {certificate}")
        return code


def submit(cfg: RootConfig, run_dir: Path, argv: list[str]) -> int:
    """Run the planned sbatch command on the written train.sbatch; print the job id and log path.
    With cluster.wait, the job's exit status."""
    if shutil.which(argv[0]) is None:
        raise EnvironmentProblem(
            "cluster=slurm: sbatch is not on PATH, so nothing was submitted. Fix: run `launch` on "
            "a SLURM login node, or submit the script written there yourself: "
            f"sbatch {argv[-1]}"
        )
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    job_id = proc.stdout.readline().strip().split(";")[0]  # --parsable: "id" or "id;cluster"
    if not job_id:
        proc.wait()
        words = proc.stderr.read().strip() or f"exit status {proc.returncode}"
        raise EnvironmentProblem(f"sbatch refused the job: {words}")
    out, err = slurm_logs(run_dir.resolve(), job_id)
    log.info(f"submitted SLURM job {job_id}; log: {out} (stderr: {err.name})")
    write_slurm_job(run_dir, job_id, waited=cfg.cluster.wait)
    if not cfg.cluster.wait:
        proc.wait()
        return 0
    log.info(
        f"waiting for job {job_id} to end (cluster.wait=true; Ctrl-C stops waiting, not the job)"
    )
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        log.warning(f"stopped waiting; job {job_id} keeps running (scancel {job_id} ends it).")
        return 130
    words = proc.stderr.read().strip()
    state = job_state(job_id) if code == 0 else None
    if state in NOT_FINISHED_STATES:
        # sbatch --wait reports 0 for a job cancelled before it started.
        log.error(
            f"job {job_id} ended {state} before it finished the run (cancelled or ended by "
            f"SLURM; its log, if it started: {out}). Fix: resubmit with sbatch {argv[-1]} (it "
            "resumes from the newest complete checkpoint)."
        )
        return FAILED
    if code == STOPPED_RESUMABLE:
        log.warning(
            f"job {job_id} stopped after saving a checkpoint and was not requeued; resume: sbatch "
            f"{argv[-1]}"
        )
    elif code:
        log.error(
            f"job {job_id} failed with exit status {code}{': ' + words if words else ''}; see "
            f"{out} and {err}"
        )
    return code


NOT_FINISHED_STATES = frozenset(
    ("CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL")
)
"""Final states of a job that did not run to its end (squeue(1)'s JOB STATE CODES)."""


def job_state(job_id: str) -> str | None:
    """SLURM's state of a job (COMPLETED, CANCELLED, ...); None once it has forgotten it."""
    proc = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    )
    found = re.search(r"\bJobState=(\S+)", proc.stdout)
    return found.group(1) if proc.returncode == 0 and found else None
