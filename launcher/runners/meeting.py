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
3. Each node that passed takes a seat (launcher/runners/seats.py: a free one, or that of a node
   that is gone, so a restarted node rejoins); all wait until parallel.min_nodes (else
   parallel.nodes) seats are taken, at most cluster.rdzv_timeout seconds: then the error names
   the nodes that came and those that did not. A node beyond parallel.nodes of a job that is not
   elastic, while they all live, is refused: the directory is that job's.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from torch.distributed import TCPStore

from launcher.config.rendezvous import NodeRendezvous
from launcher.errors import ConfigError, LauncherError
from launcher.exit_codes import FAILED
from launcher.lifetime import RunDirectoryBusy
from launcher.rundir import CONFIG_FILE, NODES_TOKEN_FILE
from launcher.runners.seats import (
    PREFIX,
    Beat,
    Seats,
    describe_node,
    free_port,
    host_store,
    is_this_machine,
    node_0_there,
    store_client,
)

T = TypeVar("T")

_PREFIX = PREFIX
FIRST_KEY = _PREFIX + "first"
FAILED_KEY = _PREFIX + "failed"
CONFIG_KEY = _PREFIX + "config"
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


class StoppedInMeeting(RendezvousFailed):
    """SIGTERM while this node waited for the others (the others wait on for it)."""

    exit_code = 128 + signal.SIGTERM


class OtherJob(ConfigError):
    """This node found another job at its endpoint: it is not one of that job's nodes, and says
    nothing to them."""


class Meeting:
    """This node's seat at the meeting; `hosts`: it is node 0 (it holds the store)."""

    def __init__(self, rdzv: NodeRendezvous, store: TCPStore, hosts: bool, deadline: float) -> None:
        self.rdzv, self.store, self.hosts, self.deadline = rdzv, store, hosts, deadline
        self.seat: int | None = None
        self.beat: Beat | None = None
        self.met = False

    @classmethod
    def open(cls, rdzv: NodeRendezvous) -> Meeting:
        deadline = time.monotonic() + rdzv.timeout  # reaching node 0's store counts too
        timeout = timedelta(seconds=rdzv.timeout)
        if rdzv.node_rank == 0 or (rdzv.node_rank is None and is_this_machine(rdzv.host)):
            try:
                store = host_store(rdzv, timeout)
                return cls(rdzv, store, hosts=True, deadline=deadline)
            except RuntimeError as exc:
                if rdzv.node_rank == 0 and not is_this_machine(rdzv.host):
                    raise ConfigError(
                        ["cluster.node_rank", "cluster.rdzv_endpoint"],
                        f"this node is node 0 (from {rdzv.sources.get('cluster.node_rank')}), "
                        f"which hosts the rendezvous at {rdzv.endpoint}, but this machine is not "
                        f"{rdzv.host}.",
                        f"check the address in cluster.rdzv_endpoint, and that only the machine "
                        f"at {rdzv.host} has node rank 0 (cluster.node_rank, NODE_RANK, "
                        "PET_NODE_RANK).",
                    ) from None
                if rdzv.node_rank == 0:
                    raise node_0_there(rdzv) or ConfigError(
                        "cluster.rdzv_endpoint",
                        f"node 0 hosts the rendezvous at {rdzv.endpoint}, but cannot listen on "
                        f"port {rdzv.port} here ({str(exc).splitlines()[0]}).",
                        "choose a free port, the same on every node, e.g. "
                        f"cluster.rdzv_endpoint={rdzv.host}:{free_port()}.",
                    ) from None
        try:
            store = store_client(rdzv.host, rdzv.port, timeout, deadline)
        except RuntimeError:
            raise RendezvousFailed(
                f"cluster.rdzv_endpoint: no node 0 answered at {rdzv.endpoint} within "
                f"{rdzv.timeout} s. Fix: start node 0 (the node at {rdzv.host}) with the same "
                "command, check that the address is right and its port open to this node, or "
                "raise cluster.rdzv_timeout."
            ) from None
        return cls(rdzv, store, hosts=False, deadline=deadline)

    def __enter__(self) -> Meeting:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.beat is not None:
            self.beat.stop()
        if self.seat is not None and exc is not None and not self.met:
            Seats(self.store, self.rdzv.nodes).give_back(self.seat)  # stopped in the meeting
        # a node refused for a full job (RunDirectoryBusy) is not one of its nodes: nothing to say
        if isinstance(exc, LauncherError) and not isinstance(
            exc, (RendezvousFailed, RunDirectoryBusy, OtherJob)
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

    def publish(self, run_dir: Path, token: str, config: dict[str, str]) -> None:
        """Node 0: the directory is ready; its token, the job's id and its config (flat)."""
        first = {**describe_node(), "rdzv_id": self.rdzv.rdzv_id, "token": token}
        self.store.set(CONFIG_KEY, json.dumps(config))
        self.store.set(FIRST_KEY, json.dumps({**first, "run_dir": str(run_dir)}))

    def follow(self, run_dir: Path, config: dict[str, str]) -> None:
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
        rdzv = self.rdzv
        if first["rdzv_id"] != rdzv.rdzv_id:
            raise OtherJob(
                ["cluster.rdzv_endpoint", "hydra.run.dir"],
                f"the endpoint {rdzv.endpoint} is taken by another job, {first['rdzv_id']!r} "
                f"({first['run_dir']}, node 0 on {first['host']}); this node's job is "
                f"{rdzv.rdzv_id!r}.",
                f"pick another port for this job, e.g. cluster.rdzv_endpoint={rdzv.host}:"
                f"{free_port()}, or give every node of one job the same hydra.run.dir.",
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
        theirs = json.loads(self.store.get(CONFIG_KEY))
        differ = sorted(k for k in {*theirs, *config} if theirs.get(k) != config.get(k))
        if differ:
            shown = ", ".join(
                f"{k}={config.get(k, '(unset)')} (node 0: {theirs.get(k, '(unset)')})"
                for k in differ[:4]
            ) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
            raise ConfigError(
                differ[:4],
                f"this node's config differs from node 0's ({run_dir / CONFIG_FILE}): {shown}.",
                "run the same command on every node (nodes.txt in the run directory has it).",
            )

    def arrive(self) -> None:
        """Take a seat (a free one, or that of a node that is gone: a restarted node rejoins);
        wait until enough nodes have (or name who did not come)."""
        rdzv = self.rdzv
        seats = Seats(self.store, rdzv.nodes)
        me = {**describe_node(), "node_rank": rdzv.node_rank}
        seat = self._alive(lambda: seats.take(me, self._raise_if_failed))
        if seat is None and rdzv.least_nodes == rdzv.nodes:
            raise RunDirectoryBusy(
                f"hydra.run.dir: the job at {rdzv.endpoint} ({rdzv.rdzv_id}) already has its "
                f"{rdzv.nodes} nodes, all alive. Fix: wait for it to end, or start another job "
                "with another run directory (hydra.run.dir=...) and endpoint."
            )
        if seat is not None:
            self.seat, self.beat = seat, Beat(rdzv.host, rdzv.port, seat)
        while len(came := self._alive(seats.taken)) < rdzv.least_nodes:
            # Through _alive too: node 0 gone is the same error whichever look finds it.
            if self._alive(lambda: self.store.check([FAILED_KEY])):
                self._raise_if_failed()
            if time.monotonic() > self.deadline:
                raise RendezvousFailed(self._missing(came))
            time.sleep(POLL_S)
        self.met = True

    def _alive(self, call: Callable[[], T]) -> T:
        """`call` on the store; node 0 gone: the launcher's error, naming who had come."""
        try:
            return call()
        except RuntimeError:
            try:
                came = Seats(self.store, self.rdzv.nodes).taken()
            except RuntimeError:
                came = {}
            raise RendezvousFailed(
                f"node 0 at {self.rdzv.endpoint} went away before every node arrived "
                f"({self._who(came)}). Fix: see node 0's output, then start the same command on "
                "every node again."
            ) from None

    def _who(self, came: dict[int, dict[str, object]]) -> str:
        named = ", ".join(
            (f"node {n['node_rank']} " if n["node_rank"] is not None else "")
            + f"{n['host']} pid {n['pid']}"
            for n in came.values()
        )
        return f"{len(came)} of {self.rdzv.least_nodes} node(s) came" + (
            f": {named}" if named else ""
        )

    def _missing(self, came: dict[int, dict[str, object]]) -> str:
        rdzv = self.rdzv
        ranks = {n["node_rank"] for n in came.values()}
        if None not in ranks:
            absent = ", ".join(f"node {r}" for r in range(rdzv.nodes) if r not in ranks)
        else:
            absent = f"{rdzv.least_nodes - len(came)} more node(s)"
        return (
            f"cluster.rdzv_timeout: the rendezvous at {rdzv.endpoint} ({rdzv.rdzv_id}) did not "
            f"complete in {rdzv.timeout} s: {self._who(came)}; missing: {absent}. Fix: start the "
            f"same command on the missing node(s) and check that they reach {rdzv.endpoint}; "
            "raise cluster.rdzv_timeout if they start later."
        )


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
