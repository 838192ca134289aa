"""The tests' warm `launch` server (tests/launch_server.py, tests/served.py): a served launch is a
process of its own with the exit status, streams, signals and deadline a subprocess has, and an
environment read at start-up gets a new interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import served
from tests.served import REPO, ServedLaunch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork server: Linux")


@pytest.fixture(scope="module")
def server() -> served._Server:
    if os.environ.get("LAUNCHER_TESTS_SUBPROCESS") == "1":
        pytest.skip("LAUNCHER_TESTS_SUBPROCESS=1: every launch a new interpreter, no server")
    found = served._server()
    if found is None:
        pytest.fail("the launch server did not start (see the warning); tests/served.py")
    return found


def test_exit_status_and_streams_are_the_launch_s(server: served._Server, tmp_path: Path) -> None:
    env = dict(server.env)
    good = served.served_run(["plan", f"hydra.run.dir={tmp_path}"], REPO, env, 120)
    assert good.returncode == 0, good.stderr
    assert "sequences/step" in good.stdout and good.stderr == ""
    bad = served.served_run(
        ["plan", "batch.global_size=-1", f"hydra.run.dir={tmp_path}"], REPO, env, 120
    )
    assert bad.returncode != 0
    assert "batch.global_size" in bad.stderr and "batch.global_size" not in bad.stdout


def _endless_run(server: served._Server, tmp_path: Path) -> ServedLaunch | subprocess.Popen[Any]:
    """A `launch train` of 100000 steps in its own session, output in tmp_path/log: through
    `popen` on this process's server, straight to any other."""
    args = ["train", "train.steps=100000", "wandb.mode=disabled", f"hydra.run.dir={tmp_path}"]
    streams: dict[str, Any] = {"stderr": subprocess.STDOUT, "own_session": True}
    with open(tmp_path / "log", "w") as log:
        if served._server() is server:
            return served.popen(args, REPO, dict(server.env), stdout=log, **streams)
        return served.ServedLaunch(server, args, REPO, dict(server.env), stdout=log, **streams)


def test_a_killed_launch_reports_the_signal(server: served._Server, tmp_path: Path) -> None:
    proc = _endless_run(server, tmp_path)
    try:
        assert isinstance(proc, ServedLaunch)
        assert proc.poll() is None
        assert os.getpgid(proc.pid) == proc.pid  # its own session, as start_new_session gives
        shown = psutil.Process(proc.pid).cmdline()  # ps and psutil see the launch's own
        assert shown[:4] == [*served.LAUNCH, "train"] and shown[-1] == f"hydra.run.dir={tmp_path}"
    finally:
        proc.kill()  # a run of 100000 steps never outlives the test
    assert proc.wait(60) == -signal.SIGKILL


def test_a_deadline_kills_the_launch(server: served._Server, tmp_path: Path) -> None:
    args = ["train", "train.steps=100000", "wandb.mode=disabled", f"hydra.run.dir={tmp_path}"]
    with pytest.raises(subprocess.TimeoutExpired):
        served.served_run(args, REPO, dict(server.env), timeout=0.5)


def test_an_environment_read_at_start_up_gets_a_new_interpreter(server: served._Server) -> None:
    same = dict(server.env)
    assert server.forks_alike({**same, "OMP_NUM_THREADS": "1", "LAUNCHER_X": "1"})
    for key in ("PYTHONPATH", "LD_PRELOAD", "TORCH_LOGS", "PYTORCH_JIT", "OMP_PROC_BIND", "LANG"):
        assert not server.forks_alike({**same, key: "x"}), key


def test_a_missing_directory_raises_as_popen_does(server: served._Server) -> None:
    with pytest.raises(FileNotFoundError):
        served.served_run(["--help"], Path("/nonexistent/launch-cwd"), dict(server.env), 60)


def test_a_request_over_the_socket_s_size_gets_an_interpreter_and_keeps_the_server(
    server: served._Server,
) -> None:
    padding = {f"LAUNCHER_TEST_PADDING{i}": "x" * 60_000 for i in range(5)}  # exec takes it
    env = {**server.env, **padding}  # 300 KB: over a SOCK_SEQPACKET message's limit
    proc = served.popen(["--help"], REPO, env, stdout=subprocess.DEVNULL)
    assert isinstance(proc, subprocess.Popen) and proc.wait(120) == 0
    assert served._server() is server


def test_a_dead_server_s_launch_can_still_be_killed(tmp_path: Path) -> None:
    other = served._Server()  # its own server: the module's stays up
    proc = _endless_run(other, tmp_path)
    other.proc.kill()
    other.proc.wait()
    try:
        with pytest.raises(RuntimeError, match="status lost"):
            proc.wait(30)
    finally:
        proc.kill()  # reaches the launch though its status cannot
    assert psutil.wait_procs([psutil.Process(proc.pid)], timeout=30)[1] == []


def test_importing_deepspeed_or_peft_keeps_launches_forked(server: served._Server) -> None:
    """Both set a start-up variable at its default when imported (PYTORCH_NVML_BASED_CUDA_CHECK,
    TORCHINDUCTOR_CACHE_DIR); tests/conftest.py sets them before the server starts, so a test
    process that imported them still forks its launches."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("peft")
    keys = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR")
    assert all(key in os.environ for key in keys)  # set by the imports, or before them
    assert server.forks_alike({**server.env, **{key: os.environ[key] for key in keys}})


def test_the_tests_inductor_cache_is_inductors_default() -> None:
    """tests/conftest.py works the directory out without importing torch: the same as torch's."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from tests.inductor_cache import default_cache_dir as worked_out

    assert worked_out() == default_cache_dir()
