from __future__ import annotations

import os
import shutil
import sys
import tempfile

# One intra-op thread for this process and every `launch` it starts (set before torch is
# imported): the tests' models are tiny, and on a busy 2-core machine two threads mostly wait on
# each other (20 steps of the tiny model measured 77 s of training with 2 threads, 5.5 s with 1).
# The runner's own default is tested with the variable unset (tests/unit/test_runners.py), and
# the contract snapshots drop it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# A C++ op DeepSpeed JIT-builds (none on the launcher's CPU paths: launcher/engines/deepspeed.py
# skips its shared-memory op) goes into this environment, never the user's per-user directory,
# which other checkouts and venvs would rebuild over.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
# train.compile's ranks compile in their own process: inductor's default on this machine is a pool
# of compile-worker interpreters per rank (one per core), each importing torch again, two ranks'
# pools on two cores. Measured on test_compile_curves: 116 -> 96 CPU-seconds, the same graphs.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Two variables that importing DeepSpeed and peft (through inductor's cache) set in this process,
# at these values: set before the launch server starts (tests/served.py), so that a test process
# that imported them still forks its launches rather than starting interpreters (a start-up
# variable that differs from the server's gets a new interpreter).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import pytest

from tests.inductor_cache import default_cache_dir

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # see above

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# The activation-probe cache (launcher/memory/probe_cache.py) is shared by this session's tests
# and their `launch` subprocesses, never with the user's cache or an earlier session.
os.environ.setdefault("LAUNCHER_CACHE_DIR", tempfile.mkdtemp(prefix="launcher-test-cache-"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.schedule import reorder

    items[:] = reorder(items, lambda item: item.nodeid.split("::")[0])
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_torch_thread():
    """Tiny ops on a shared 2-core machine: a second intra-op thread only adds contention."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, the controller makes the core tokens its workers share
    (tests/cores.py)."""
    from tests import cores

    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        os.environ[cores.DIR_ENV] = tempfile.mkdtemp(prefix="launcher-test-cores-")
        os.environ[cores.COUNT_ENV] = str(len(os.sched_getaffinity(0)) * cores.TOKENS_PER_CORE)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller removes the token directory it made (the workers have ended)."""
    from tests import cores

    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        directory = os.environ.pop(cores.DIR_ENV, None)
        if directory and os.path.basename(directory).startswith("launcher-test-cores-"):
            shutil.rmtree(directory, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Each test holds a core token (one per core when marked multiproc or slurm) from its
    set-up to its tear-down: see tests/cores.py."""
    from tests import suite_profile
    from tests.cores import TOKENS_PER_CORE, cores

    found = cores()
    if found is None:
        return (yield)
    every = item.get_closest_marker("multiproc") or item.get_closest_marker("slurm")
    with suite_profile.recorded(item.nodeid, found):
        found.take(found.count // TOKENS_PER_CORE if every else 1)
        try:
            return (yield)
        finally:
            found.release()
