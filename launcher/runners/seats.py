"""cluster=torchrun: the seats of the meeting (launcher/runners/meeting.py), one per node.

A node takes a free seat (`compare_set` on the store: two nodes never take the same one) and
keeps it alive while it lives: a thread of its own adds one to the seat's beat every BEAT_S
seconds. A node that leaves (kill -9, Ctrl-C, a lost machine) stops beating; a node that comes
later and finds every seat taken watches the beats for STALE_S seconds and takes the seat of a
node that is gone. So a node restarted by hand or by its engine rejoins its job, and a node
beyond the job's nodes, while they all live, is refused. A node that stops in the meeting gives
its seat back at once.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta

import psutil
from torch.distributed import TCPStore

from launcher.config.rendezvous import NodeRendezvous
from launcher.errors import ConfigError

PREFIX = "launcher/nodes/"
NODE_0_KEY = PREFIX + "node0"
"""Set by node 0 as it opens the store: the job's id, node 0's host and pid."""
BEAT_S = 0.5
STALE_S = 3.0
"""A seat whose beat has not moved for this long belongs to a node that is gone."""
GREETING_S = 30.0
"""How long node 0's store may take to answer a new client's greeting: a store answers in
milliseconds; another program on the port (an HTTP server) never does, and torch's client then
waits for ever, whatever its timeout."""


def seat_key(seat: int) -> str:
    return f"{PREFIX}seat{seat}"


def beat_key(seat: int) -> str:
    return f"{PREFIX}beat{seat}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def port_answers(host: str, port: int, deadline: float) -> bool:
    """Whether something accepts connections at host:port before `deadline` (time.monotonic)."""
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1.0, left))):
                return True
        except OSError:
            if left <= 0:
                return False
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def store_client(host: str, port: int, timeout: timedelta, deadline: float) -> TCPStore:
    """A client of node 0's store at host:port. RuntimeError: nothing answered before `deadline`
    (polled first: torch's own connect waits about twice its timeout, with C++ stacks);
    ConfigError: something answers there but is not a store."""
    if not port_answers(host, port, deadline):
        raise RuntimeError(f"nothing answered at {host}:{port}")
    made: list[TCPStore] = []
    failed: list[RuntimeError] = []

    def connect() -> None:
        try:
            made.append(TCPStore(host, port, is_master=False, timeout=timeout))
        except RuntimeError as exc:
            failed.append(exc)

    greeting = threading.Thread(target=connect, name="launcher-store-connect", daemon=True)
    greeting.start()
    waited = max(1.0, min(GREETING_S, deadline - time.monotonic()))
    greeting.join(waited)
    if made:
        return made[0]
    if failed:
        raise failed[0]
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    raise ConfigError(
        "cluster.rdzv_endpoint",
        f"something at {endpoint} accepts connections but did not answer as a rendezvous in "
        f"{waited:.0f} s: another program holds that port on {host} (or a proxy on the way "
        "answers for it), not node 0 of a job.",
        f"check that {host} is node 0's address, and pick a port that is free there, the same "
        f"on every node, e.g. cluster.rdzv_endpoint={endpoint.rsplit(':', 1)[0]}:{free_port()}.",
    )


def host_store(rdzv: NodeRendezvous, timeout: timedelta) -> TCPStore:
    """Node 0's store at the endpoint, saying whose it is (RuntimeError: the port is taken)."""
    store = TCPStore(
        rdzv.host,
        rdzv.port,
        is_master=True,
        multi_tenant=True,  # torchrun's c10d rendezvous shares it
        wait_for_workers=False,
        timeout=timeout,
    )
    store.set(NODE_0_KEY, json.dumps({**describe_node(), "rdzv_id": rdzv.rdzv_id}))
    return store


def node_0_there(rdzv: NodeRendezvous) -> ConfigError | None:
    """For a node given rank 0 that cannot listen on the endpoint: the error naming the node 0
    already there (of this job: two nodes given rank 0; of another job: the port is taken);
    None where no job's node 0 answers."""
    try:
        store = store_client(rdzv.host, rdzv.port, timedelta(seconds=5), time.monotonic() + 5)
        if not store.check([NODE_0_KEY]):
            return None  # a store, but not a job's node 0: the port alone is named
        there = json.loads(store.get(NODE_0_KEY))
    except (RuntimeError, ConfigError):
        return None
    if there["rdzv_id"] != rdzv.rdzv_id:
        return ConfigError(
            ["cluster.rdzv_endpoint", "hydra.run.dir"],
            f"the endpoint {rdzv.endpoint} is taken by another job, {there['rdzv_id']!r} (node 0 "
            f"on {there['host']}, pid {there['pid']}); this node's job is {rdzv.rdzv_id!r}.",
            f"pick another port for this job, e.g. cluster.rdzv_endpoint={rdzv.host}:"
            f"{free_port()}, or give every node of one job the same hydra.run.dir.",
        )
    where, last = rdzv.sources.get("cluster.node_rank"), rdzv.nodes - 1
    ranks = f"1 to {last}" if last > 1 else "1"
    hint = (
        "" if where == "cluster.node_rank" else f" ({where} in its environment: check what sets it)"
    )
    return ConfigError(
        "cluster.node_rank",
        f"this node is node 0 (from {where}), but the job {rdzv.rdzv_id!r} at {rdzv.endpoint} "
        f"has its node 0 already ({there['host']}, pid {there['pid']}): each node rank belongs "
        "to one node.",
        f"give this node a rank no other node has ({ranks}), e.g. cluster.node_rank={last}{hint}.",
    )


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


class Seats:
    """The seats 1..`count` at the meeting on `store` (each node's own client)."""

    def __init__(self, store: TCPStore, count: int) -> None:
        self.store, self.count = store, count

    def taken(self) -> dict[int, dict[str, object]]:
        """seat -> the node in it."""
        keys = [seat_key(i) for i in range(1, self.count + 1)]
        found: dict[int, dict[str, object]] = {}
        for i, key in enumerate(keys, start=1):
            if self.store.check([key]):
                found[i] = json.loads(self.store.get(key))
        return found

    def take(self, me: dict[str, object], waiting: Callable[[], None]) -> int | None:
        """A seat for this node: a free one, else one whose node is gone (watched STALE_S);
        None when every seat's node lives. `waiting` is called while watching."""
        mine = json.dumps(me)
        for i in range(1, self.count + 1):
            if self.store.compare_set(seat_key(i), "", mine).decode() == mine:
                return i
        before = {i: self.store.add(beat_key(i), 0) for i in range(1, self.count + 1)}
        until = time.monotonic() + STALE_S
        while time.monotonic() < until:
            waiting()
            time.sleep(0.1)
        for i in range(1, self.count + 1):
            if self.store.add(beat_key(i), 0) != before[i]:
                continue  # its node lives
            held = self.store.get(seat_key(i)).decode()
            if self.store.compare_set(seat_key(i), held, mine).decode() == mine:
                return i
        return None

    def give_back(self, seat: int) -> None:
        with suppress(RuntimeError):  # node 0 is gone: so is the seat
            self.store.delete_key(seat_key(seat))


class Beat:
    """A thread beating for this node's seat, on its own connection, until stopped."""

    def __init__(self, host: str, port: int, seat: int) -> None:
        self.host, self.port, self.seat = host, port, seat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="launcher-seat-beat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            store = TCPStore(
                self.host, self.port, is_master=False, timeout=timedelta(seconds=STALE_S)
            )
            while not self._stop.wait(BEAT_S):
                store.add(beat_key(self.seat), 1)
        except RuntimeError:
            return  # node 0 is gone: the agent says so

    def stop(self) -> None:
        self._stop.set()
