"""cluster=torchrun: the nodes of a job meet before torchrun's own rendezvous, to agree on the run
directory and to name the nodes that do not come.

They meet on one TCP store at the rendezvous endpoint, hosted by node 0 (cluster.node_rank=0, or
without node ranks the node that binds the endpoint's port first); torchrun's c10d rendezvous in
the same process then shares that store (torch's multi-tenant TCPStore), so the endpoint is one
port.

1. Node 0 prepares the run directory (its lock, config.yaml, plan.json), writes a fresh token
   into it (.nodes_token) and publishes the token and the job's rdzv_id.
2. Every other node waits for that and reads the token from its own view of the directory:
   another token, or none, means that it does not see node 0's directory; it stops with the
   shared-filesystem error and tells the others, which stop too.
3. Each node that passed counts itself in; all wait until parallel.min_nodes (else
   parallel.nodes) have, at most cluster.rdzv_timeout seconds: then the error names the nodes
   that came and those that did not. A node beyond parallel.nodes of a job that is not elastic is
   refused: the directory is that job's.
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from types import TracebackType

import psutil
from torch.distributed import TCPStore

from launcher.config.rendezvous import NodeRendezvous
from launcher.errors import ConfigError, LauncherError
from launcher.exit_codes import FAILED
from launcher.lifetime import RunDirectoryBusy
from launcher.rundir import NODES_TOKEN_FILE

_PREFIX = "launcher/nodes/"
FIRST_KEY = _PREFIX + "first"
ARRIVED_KEY = _PREFIX + "arrived"
FAILED_KEY = _PREFIX + "failed"
POLL_S = 0.1
TOKEN_GRACE_S = 10.0
"""How long a node looks for node 0's token in its run directory (a network filesystem may show
a new file late)."""
SHARED_FIX = (
    "put hydra.run.dir on a filesystem all nodes share (NFS, a volume mounted at the same path on "
    "every node) and give every node the same hydra.run.dir."
)


class RendezvousFailed(LauncherError):
    """The nodes did not all come, or one of them stopped before training."""

    exit_code = FAILED


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def is_this_machine(host: str) -> bool:
    """Whether `host` names an address of this machine (loopback included)."""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    mine = {
        str(address.address).split("%")[0]
        for nic in psutil.net_if_addrs().values()
        for address in nic
        if address.family in (socket.AF_INET, socket.AF_INET6)
    }
    return bool(addresses & mine) or any(a.startswith("127.") or a == "::1" for a in addresses)


def describe_node() -> dict[str, object]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


class Meeting:
    """This node's seat at the meeting; `hosts`: it is node 0 (it holds the store)."""

    def __init__(self, rdzv: NodeRendezvous, store: TCPStore, hosts: bool) -> None:
        self.rdzv, self.store, self.hosts = rdzv, store, hosts
        self.deadline = time.monotonic() + rdzv.timeout

    @classmethod
    def open(cls, rdzv: NodeRendezvous) -> Meeting:
        timeout = timedelta(seconds=rdzv.timeout)
        if rdzv.node_rank == 0 or (rdzv.node_rank is None and is_this_machine(rdzv.host)):
            try:
                store = TCPStore(
                    rdzv.host,
                    rdzv.port,
                    is_master=True,
                    multi_tenant=True,  # torchrun's c10d rendezvous shares it
                    wait_for_workers=False,
                    timeout=timeout,
                )
                return cls(rdzv, store, hosts=True)
            except RuntimeError as exc:
                if rdzv.node_rank == 0:
                    raise ConfigError(
                        "cluster.rdzv_endpoint",
                        f"node 0 hosts the rendezvous at {rdzv.endpoint}, but cannot listen on "
                        f"port {rdzv.port} here ({str(exc).splitlines()[0]}).",
                        "choose a free port, the same on every node, e.g. "
                        f"cluster.rdzv_endpoint={rdzv.host}:{free_port()}.",
                    ) from None
        try:
            store = TCPStore(rdzv.host, rdzv.port, is_master=False, timeout=timeout)
        except RuntimeError:
            raise RendezvousFailed(
                f"cluster.rdzv_endpoint: no node 0 answered at {rdzv.endpoint} within "
                f"{rdzv.timeout} s. Fix: start node 0 (the node at {rdzv.host}) with the same "
                "command, check that the address is right and its port open to this node, or "
                "raise cluster.rdzv_timeout."
            ) from None
        return cls(rdzv, store, hosts=False)

    def __enter__(self) -> Meeting:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # a node refused for a full job (RunDirectoryBusy) is not one of its nodes: nothing to say
        if isinstance(exc, LauncherError) and not isinstance(
            exc, (RendezvousFailed, RunDirectoryBusy)
        ):
            self._tell_others(str(exc))

    def _tell_others(self, message: str) -> None:
        try:
            node = f"node {self.rdzv.node_rank}" if self.rdzv.node_rank is not None else "a node"
            info = {**describe_node(), "node": node, "why": message}
            self.store.set(FAILED_KEY, json.dumps(info))
        except RuntimeError:
            pass  # node 0 is gone: it has stopped already

    def _has(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except RuntimeError:
            raise RendezvousFailed(
                f"node 0 (the rendezvous host at {self.rdzv.endpoint}) went away before training "
                "started. Fix: see node 0's output, then start every node again with the same "
                "command."
            ) from None

    def _raise_if_failed(self) -> None:
        if self._has(FAILED_KEY):
            info = json.loads(self.store.get(FAILED_KEY))
            raise RendezvousFailed(
                f"{info['node']} ({info['host']}, pid {info['pid']}) stopped before training: "
                f"{info['why']}"
            )

    def publish(self, run_dir: Path, token: str) -> None:
        """Node 0: the directory is ready; its token and the job's id."""
        first = {**describe_node(), "rdzv_id": self.rdzv.rdzv_id, "token": token}
        self.store.set(FIRST_KEY, json.dumps({**first, "run_dir": str(run_dir)}))

    def follow(self, run_dir: Path) -> None:
        """Another node: wait for node 0's token and check that this node sees it."""
        while not self._has(FIRST_KEY):
            self._raise_if_failed()
            if time.monotonic() > self.deadline:
                raise RendezvousFailed(
                    f"cluster.rdzv_timeout: node 0 at {self.rdzv.endpoint} did not open the run "
                    f"directory in {self.rdzv.timeout} s. Fix: see node 0's output; raise "
                    "cluster.rdzv_timeout if it starts later."
                )
            time.sleep(POLL_S)
        first = json.loads(self.store.get(FIRST_KEY))
        if first["rdzv_id"] != self.rdzv.rdzv_id:
            raise ConfigError(
                ["cluster.rdzv_id", "hydra.run.dir"],
                f"this node's job is {self.rdzv.rdzv_id!r}, but node 0 ({first['host']}) runs "
                f"{first['rdzv_id']!r} ({first['run_dir']}).",
                "give every node the same hydra.run.dir (or the same cluster.rdzv_id).",
            )
        path = run_dir / NODES_TOKEN_FILE
        grace = time.monotonic() + min(TOKEN_GRACE_S, self.rdzv.timeout)
        while (seen := _read(path)) != first["token"] and time.monotonic() < grace:
            time.sleep(POLL_S)
        if seen != first["token"]:
            what = "no token there" if seen is None else "another run's token there"
            raise ConfigError(
                "hydra.run.dir",
                f"this node does not see the run directory node 0 ({first['host']}) prepared: "
                f"{run_dir} has {what} ({NODES_TOKEN_FILE}).",
                SHARED_FIX,
            )

    def arrive(self) -> None:
        """Count this node in; wait until enough nodes have (or name who did not come)."""
        rdzv = self.rdzv
        seat = self.store.add(ARRIVED_KEY, 1)
        node = {**describe_node(), "node_rank": rdzv.node_rank}
        self.store.set(f"{_PREFIX}node{seat}", json.dumps(node))
        if seat > rdzv.nodes and rdzv.least_nodes == rdzv.nodes:
            raise RunDirectoryBusy(
                f"hydra.run.dir: the job at {rdzv.endpoint} ({rdzv.rdzv_id}) already has its "
                f"{rdzv.nodes} nodes. Fix: wait for it to end, or start another job with another "
                "run directory (hydra.run.dir=...) and endpoint."
            )
        while (came := self.store.add(ARRIVED_KEY, 0)) < rdzv.least_nodes:
            self._raise_if_failed()
            if time.monotonic() > self.deadline:
                raise RendezvousFailed(self._missing(came))
            time.sleep(POLL_S)

    def _missing(self, came: int) -> str:
        rdzv = self.rdzv
        seats = [f"{_PREFIX}node{i}" for i in range(1, came + 1)]
        # a node counts itself in, then says who it is: one between the two is left out
        nodes = [json.loads(self.store.get(k)) for k in seats if self.store.check([k])]
        named = ", ".join(
            (f"node {n['node_rank']} " if n["node_rank"] is not None else "")
            + f"({n['host']}, pid {n['pid']})"
            for n in nodes
        )
        ranks = {n["node_rank"] for n in nodes}
        if None not in ranks:
            absent = ", ".join(f"node {r}" for r in range(rdzv.nodes) if r not in ranks)
        else:
            absent = f"{rdzv.least_nodes - came} more node(s)"
        return (
            f"cluster.rdzv_timeout: the rendezvous at {rdzv.endpoint} ({rdzv.rdzv_id}) did not "
            f"complete in {rdzv.timeout} s: {came} of {rdzv.least_nodes} node(s) came ({named}); "
            f"missing: {absent}. Fix: start the same command on the missing node(s) and check "
            f"that they reach {rdzv.endpoint}; raise cluster.rdzv_timeout if they start later."
        )


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
