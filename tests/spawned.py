"""Rank groups of the tests that start their own gloo ranks (torch.multiprocessing): forked from a
warm forkserver instead of spawned.

A spawned rank is a new interpreter that imports torch, the launcher, DeepSpeed and transformers'
models again before its first step: 2-5 CPU-seconds a rank on CI's cores. The forkserver
(multiprocessing's own, one per test process, started on first use) imports them once and forks
each rank from itself before it has run anything; a rank is otherwise what a spawned one is (the
function and its arguments pickled, the forkserver's environment, which is the test process's when
the first group started). The ranks are the forkserver's children, not this process's, so each
rank's CPU time is counted here for the suite profile (tests/suite_profile.py).
"""

from __future__ import annotations

import gc
import multiprocessing
import resource
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from tests.served import CPU_SECONDS

PRELOAD = ["tests.rank_preload"]  # one module: see its docstring


def _counted(rank: int, fn: Callable[..., None], cpu_dir: str, args: tuple[Any, ...]) -> None:
    gc.freeze()  # the forkserver's imports: no collection of this rank walks (and copies) them
    try:
        fn(rank, *args)
    finally:
        # This rank's own from its fork, and its children's (inductor's C++ compilers).
        used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        Path(cpu_dir, f"rank{rank}").write_text(str(sum(u.ru_utime + u.ru_stime for u in used)))


@contextmanager
def rank_group(
    fn: Callable[..., None], args: tuple[Any, ...], nprocs: int
) -> Iterator[mp.ProcessContext]:
    """`fn(rank, *args)` in nprocs forked ranks, as `mp.start_processes(join=False)`; the ranks
    still alive when the block ends are terminated."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # read once, when the forkserver starts
    cpu_dir = tempfile.mkdtemp(prefix="launcher-test-ranks-")
    ranks: mp.ProcessContext | None = None
    try:
        ranks = mp.start_processes(
            _counted, (fn, cpu_dir, args), nprocs=nprocs, join=False, start_method="forkserver"
        )
        yield ranks
    finally:
        for process in ranks.processes if ranks is not None else []:
            if process.is_alive():
                process.terminate()
            process.join(timeout=30)  # as torch's own join: a rank that ignores SIGTERM is killed
            if process.is_alive():
                process.kill()
                process.join()
        CPU_SECONDS[0] += sum(float(f.read_text() or 0) for f in Path(cpu_dir).glob("rank*"))
        shutil.rmtree(cpu_dir, ignore_errors=True)


def run_ranks(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """`mp.spawn(fn, args, nprocs)`: returns when every rank has ended; a rank that raised
    raises here (the others are ended)."""
    with rank_group(fn, args, nprocs) as ranks:
        while not ranks.join():
            pass
