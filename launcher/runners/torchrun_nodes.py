"""cluster=torchrun: several nodes without a scheduler. The same `launch train ... cluster=torchrun`
runs on every node (by hand, in Kubeflow Trainer's pods, under SkyPilot); each runs torchrun's
agent in its own process, as the local runner does (launcher/runners/torchrun.py), and the agents
meet at a c10d rendezvous at cluster.rdzv_endpoint.

Node 0 (cluster.node_rank=0, or the node that holds the endpoint's port) prepares the shared run
directory, as `launch` does on one machine: its lock, config.yaml, plan.json, nodes.txt; the
ranks write metrics, summary and checkpoints there as on SLURM (global rank 0 writes the run's
files). The other nodes check that they see that directory and write nothing of their own but
torchrun's scratch (launcher/runners/meeting.py). SIGTERM to the nodes stops the ranks after a
checkpoint (exit STOPPED_RESUMABLE); the same command on every node resumes.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.config.load import to_plain
from launcher.config.rendezvous import NodeRendezvous, resolve_rendezvous
from launcher.config.root import RootConfig
from launcher.errors import ConfigError
from launcher.exit_codes import COMPLETE_HELD, HUNG, STOPPED_RESUMABLE
from launcher.logs import get_logger
from launcher.rundir import AGENT_DIR, CONFIG_FILE, NODES_FILE, NODES_TOKEN_FILE, stopped_words
from launcher.runners.local import LocalRunner
from launcher.runners.meeting_ends import host_gone, rendezvous_lost, stop_raises
from launcher.runners.torchrun import MONITOR_INTERVAL_S, TORCHRUN, environment_additions
from launcher.secrets import redactor_for
from launcher.userpath import replace_own

log = get_logger(__name__)

if TYPE_CHECKING:
    from launcher.plan import Plan
    from launcher.runners.meeting import Meeting

KEEP_ALIVE_ATTEMPTS = 3
"""A node whose agent misses this many keep-alives in a row is gone (torchrun's default)."""
NODE_ONLY_KEYS = (
    "cluster.node_rank=",
    "+cluster.node_rank=",
    "++cluster.node_rank=",
    "hydra.run.dir=",
)
"""Overrides left out of the command every node runs: a node's own, and the directory (added
back, absolute)."""


def node_name(rdzv: NodeRendezvous) -> str:
    """This node in file names: node<rank>, or host-pid while its rank is not known."""
    if rdzv.node_rank is not None:
        return f"node{rdzv.node_rank}"
    return f"{socket.gethostname()}-{os.getpid()}"


def node_argv(
    cfg: RootConfig, run_dir: Path, rdzv: NodeRendezvous, hosts: bool, worker: str
) -> list[str]:
    """This node's torchrun command: every argument given (torchrun reads PET_* variables only for
    the arguments it is not given)."""
    from launcher.runners.agent import handles_signals_option

    parallel, cluster = cfg.parallel, cfg.cluster
    nnodes = f"{rdzv.least_nodes}:{rdzv.nodes}" if parallel.elastic else str(rdzv.nodes)
    conf = (
        f"is_host={'true' if hosts else 'false'},join_timeout={rdzv.timeout},"
        f"last_call_timeout={cluster.rdzv_last_call},keep_alive_interval={cluster.rdzv_keep_alive},"
        f"keep_alive_max_attempt={KEEP_ALIVE_ATTEMPTS}"
    )
    local_addr = os.environ.get("PET_LOCAL_ADDR", "").strip()
    return [
        TORCHRUN,
        f"--nnodes={nnodes}",
        f"--nproc_per_node={parallel.ranks_per_node}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={rdzv.endpoint}",
        f"--rdzv_id={rdzv.rdzv_id}",
        f"--rdzv_conf={conf}",
        *([f"--local_addr={local_addr}"] if local_addr else []),
        f"--max_restarts={cfg.restarts}",
        f"--monitor_interval={MONITOR_INTERVAL_S}",
        f"--log-dir={run_dir / AGENT_DIR / node_name(rdzv)}",
        *(["--signals_to_handle=SIGQUIT"] if handles_signals_option() else []),
        "-m",
        worker,
        str(run_dir / CONFIG_FILE),
    ]


def every_node_command(run_dir: Path, command: str = "train") -> str:
    """`launch <command>` with this launch's overrides (as Hydra parsed them) less a node's own, and
    the run directory: the one command every node runs."""
    from hydra.core.hydra_config import HydraConfig

    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # called outside a Hydra job (a test calling train_command)
        overrides = []
    kept = [str(o) for o in overrides if not str(o).startswith(NODE_ONLY_KEYS)]
    return shlex.join(["launch", command, *kept, f"hydra.run.dir={run_dir.resolve()}"])


def nodes_text(run_dir: Path, rdzv: NodeRendezvous, command: str = "train") -> str:
    """nodes.txt: the command every node runs and where each rendezvous value came from."""
    values = {
        "parallel.nodes": str(rdzv.nodes),
        **({"parallel.min_nodes": str(rdzv.least_nodes)} if rdzv.least_nodes < rdzv.nodes else {}),
        "cluster.rdzv_endpoint": rdzv.endpoint,
        "cluster.rdzv_id": rdzv.rdzv_id,
        "cluster.node_rank": "-" if rdzv.node_rank is None else str(rdzv.node_rank),
    }
    # `launch plan` on another node writes its own view (its rank); a run's file is node 0's
    reader = "node 0" if rdzv.node_rank is None else f"node {rdzv.node_rank}"
    lines = [
        "# cluster=torchrun: run this same command on every node (each node's rank, if any,",
        "# from its environment or cluster.node_rank=R); node 0 hosts the rendezvous:",
        every_node_command(run_dir, command),
        f"# the rendezvous values as {reader} read them, and where each came from:",
        *(f"{key:<22} {value:<24} {rdzv.sources[key]}" for key, value in values.items()),
    ]
    return "\n".join(lines) + "\n"


class TorchrunNodesRunner(LocalRunner):
    name = "torchrun-nodes"

    def __init__(self) -> None:
        self.rendezvous: NodeRendezvous | None = None
        self.job_dir: Path | None = None  # the run directory every node names (not verify's split)
        self.meeting: Meeting | None = None
        self.first_node = True

    def _rdzv(self) -> NodeRendezvous:
        if self.rendezvous is None:
            raise RuntimeError("cluster=torchrun: the rendezvous is resolved first (resolve())")
        return self.rendezvous

    def resolve(self, cfg: RootConfig, run_dir: Path) -> RootConfig:
        if cfg.verify.first:
            raise ConfigError(
                ["verify.first", "cluster"],
                "verify.first certifies the split before training, which cluster=torchrun's "
                "nodes do not do in one command.",
                "set verify.first=false, and certify the split first: `launch verify` with the "
                "same overrides on every node (docs/multinode.md).",
            )
        cfg, self.rendezvous = resolve_rendezvous(cfg, run_dir, os.environ)
        self.job_dir = run_dir
        return cfg

    def claim_run_dir(self, cfg: RootConfig, dry_run: bool) -> bool:
        if dry_run:
            return True
        from launcher.runners.meeting import Meeting

        self.meeting = Meeting.open(self._rdzv())
        self.first_node = self.meeting.hosts
        return self.first_node

    def lock_holder(self) -> str | None:
        rdzv = self.rendezvous
        if rdzv is None:
            return None
        return f"node 0 of the cluster=torchrun job {rdzv.rdzv_id} at {rdzv.endpoint}"

    def command(self, cfg: RootConfig, run_dir: Path) -> list[str]:
        return node_argv(cfg, run_dir, self._rdzv(), self.first_node, self.worker)

    def environment(self, cfg: RootConfig) -> dict[str, str]:
        return environment_additions(cfg)

    def files(self, cfg: RootConfig, run_dir: Path) -> dict[str, str]:
        job_dir = self.job_dir or run_dir
        return {NODES_FILE: nodes_text(job_dir, self._rdzv(), self.launch_command)}

    def verify_runner(self) -> TorchrunNodesRunner:
        return self  # the split runs on the job's nodes, met at launch verify's start

    def run(self, cfg: RootConfig, run_dir: Path, plan: Plan) -> int:
        from torch.distributed.elastic.rendezvous.api import RendezvousError

        from launcher.runners.meeting import Meeting, RendezvousFailed
        from launcher.runners.torchrun import run_torchrun

        rdzv = self._rdzv()
        meeting = self.meeting
        if meeting is None:  # not started through prepare_run: meet now
            meeting = self.meeting = Meeting.open(rdzv)
            self.first_node = meeting.hosts
        with meeting:
            with stop_raises(rdzv, self.first_node):
                if self.first_node:
                    token = secrets.token_hex(16)
                    replace_own(run_dir / NODES_TOKEN_FILE, token + "\n")
                    meeting.publish(run_dir, token, flat_config(cfg))
                else:
                    meeting.follow(run_dir, flat_config(cfg))
                meeting.arrive()
            scratch = run_dir / AGENT_DIR / node_name(rdzv)
            try:
                code = run_torchrun(
                    run_dir, plan.command, plan.env, first_node=self.first_node, scratch=scratch
                )
            except RendezvousError as exc:
                raise RendezvousFailed(rendezvous_lost(rdzv, exc, self.first_node)) from None
            failed = code not in (0, STOPPED_RESUMABLE, HUNG, COMPLETE_HELD)
            if failed and not self.first_node and host_gone(meeting):
                # the ranks failed because node 0 went away: say that, not only their error (not
                # after this node's watchdog ended them for a hang: node 0 may end first then)
                raise RendezvousFailed(rendezvous_lost(rdzv, ConnectionError(), hosts=False))
        if code == 0 and not self.first_node:
            log.info(f"{node_name(rdzv)}: done")
        elif code == STOPPED_RESUMABLE and not self.first_node:  # else its last line is torch's
            log.warning(
                f"{node_name(rdzv)}: {stopped_words(run_dir)}. Run the same command on every node "
                f"to resume (exit status {STOPPED_RESUMABLE})."
            )
        return code


def flat_config(cfg: RootConfig) -> dict[str, str]:
    """The resolved config as key -> value (JSON), credentials redacted, less a node's own keys:
    what every node of a job must agree on."""
    plain = to_plain(cfg)
    plain = redactor_for(plain).data(plain)
    flat: dict[str, str] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        else:
            flat[prefix[:-1]] = json.dumps(value, sort_keys=True)

    walk("", plain)
    flat.pop("cluster.node_rank", None)
    return flat
