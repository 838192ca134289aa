"""launcher/distributed.py's set_aside_what_is_alive: a rank that joins its group collects its
garbage once, then sets what is alive (torch's modules above all) aside from the cyclic collector,
so that every later full collection walks only what the run made; a rank forked from `launch`
(launcher/runners/rank_child.py) sets aside what it inherited first. Counted, not timed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from launcher.config.load import to_yaml
from tests.harness import make_config


def test_a_rank_collects_once_then_sets_aside_what_is_alive_when_it_joins_its_group() -> None:
    code = textwrap.dedent(
        """
        import gc, weakref
        import torch
        from launcher.distributed import init_distributed, teardown_distributed

        class Cycle:
            pass

        gc.disable()  # no automatic collection decides the cycle's fate before the rank starts
        garbage = Cycle()
        garbage.me = garbage
        gone = weakref.ref(garbage)
        del garbage
        init_distributed("cpu")  # a one-rank gloo group in this process
        print(gone() is None, gc.get_freeze_count(), len(gc.get_objects()))
        teardown_distributed()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    collected, frozen, tracked = proc.stdout.split()[-3:]
    assert collected == "True", proc.stdout + proc.stderr  # garbage is collected, never set aside
    assert int(frozen) > 100_000  # torch's and the launcher's objects
    assert int(tracked) < int(frozen) // 10  # what a full collection still walks


def test_a_process_that_trains_again_collects_what_each_run_set_aside() -> None:
    """An in-process sweep: each point's config is alive when its rank starts (set aside) and
    garbage once it ends; the next point's start collects it, for every point."""
    code = textwrap.dedent(
        """
        import gc, weakref
        import torch
        from launcher.distributed import init_distributed, teardown_distributed

        class Config:
            pass

        def point():
            config = Config()
            config.me = config  # a cycle: only the collector frees it
            alive = weakref.ref(config)
            init_distributed("cpu")
            teardown_distributed()
            return alive

        gc.disable()
        points = [point() for _ in range(3)]
        print(*(p() is None for p in points))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    # the last point's config waits for the collector's next full pass, as any garbage does
    assert proc.stdout.split()[-3:] == ["True", "True", "False"], proc.stdout + proc.stderr


def test_a_rank_forked_from_launch_sets_aside_what_it_inherited(tmp_path: Path) -> None:
    """The agent's process holds torch's and the launcher's objects; a rank forked from it sets
    them aside before anything else, so that no collection of the rank walks (and copies) them."""
    (tmp_path / "config.yaml").write_text(to_yaml(make_config()))
    code = textwrap.dedent(
        f"""
        import gc, os, sys
        import torch, launcher.worker.run
        from launcher.runners import rank_fork
        config = {str(tmp_path / "config.yaml")!r}
        env = {{**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}}
        args = (sys.executable, "-u", "-m", "launcher.worker", config)
        rank = rank_fork._fork("tests.fixtures.gc_probe_worker", [config], env, args)
        print(len(gc.get_objects()), rank.wait(timeout=120))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True
    )
    parent, status = proc.stdout.split()[-2:]
    assert status == "0", proc.stdout + proc.stderr
    tracked, frozen = (int(n) for n in (tmp_path / "gc.txt").read_text().split())
    assert frozen > 100_000  # what the parent had loaded
    assert tracked < int(parent) // 10, (tracked, parent)  # what the rank's collections walk
