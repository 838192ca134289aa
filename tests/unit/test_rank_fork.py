"""launcher/runners/rank_fork.py: which commands fork, the Popen stand-in torchrun's agent polls,
and the probe that keeps a process whose torch threads ran from forking ranks."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.runners import rank_fork
from launcher.runners.rank_fork import ForkedRank, _worker_of, fork_possible

PY = sys.executable


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            (PY, "-u", "-m", "launcher.worker", "run/config.yaml"),
            ("launcher.worker", ["run/config.yaml"]),
        ),
        ((PY, "-m", "launcher.verify.worker", "c.yaml"), ("launcher.verify.worker", ["c.yaml"])),
        ((PY, "-u", "-m", "my_project.train", "c.yaml"), None),  # not the launcher's: exec
        ((PY, "-u", "train.py", "c.yaml"), None),
        ((PY, "-X", "dev", "-m", "launcher.worker", "c.yaml"), None),  # flags only exec honours
        (("/other/python", "-u", "-m", "launcher.worker", "c.yaml"), None),
    ],
)
def test_only_the_launchers_own_worker_command_is_forked(
    args: tuple[str, ...], expected: tuple[str, list[str]] | None
) -> None:
    assert _worker_of(args) == expected


def _child(code: int, sleep_s: float = 0.0) -> ForkedRank:
    pid = os.fork()
    if pid == 0:
        time.sleep(sleep_s)
        os._exit(code)
    return ForkedRank(pid, ("child",))


def test_a_forked_rank_reports_its_exit_status_and_signal_as_popen_does() -> None:
    assert _child(3).wait() == 3
    killed = _child(0, sleep_s=30)
    assert killed.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        killed.wait(timeout=0.05)
    killed.kill()
    assert killed.wait() == -signal.SIGKILL
    killed.kill()  # a second signal to an ended rank is a no-op, as for a Popen


def test_exec_is_asked_for_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rank_fork.RANK_START_ENV, "exec")
    assert fork_possible() is False


def test_the_probe_refuses_a_process_whose_torch_threads_have_run() -> None:
    # In a process of its own: this one's threads may have run already.
    script = textwrap.dedent(
        """
        import torch
        from launcher.runners.rank_fork import fork_possible
        fresh = fork_possible()
        torch.set_num_threads(2)
        torch.ones(1 << 17).add_(1)  # OpenMP's pool starts
        print(fresh, fork_possible())
        """
    )
    env = {k: v for k, v in os.environ.items() if k != rank_fork.RANK_START_ENV}
    out = subprocess.run([PY, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["True", "False"], out.stderr


def test_a_process_that_trained_forks_no_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rank_fork.RANK_START_ENV, raising=False)
    monkeypatch.setattr(rank_fork, "_TRAINED_HERE", False)
    rank_fork.trained_here()
    assert fork_possible() is False


def test_a_forked_rank_that_fails_ends_with_its_status_and_runs_none_of_the_parents_hooks(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "parent_hook_ran"
    me = os.getpid()

    def parent_hook() -> None:  # would run in the rank if its exit hooks were the parent's
        if os.getpid() != me:
            marker.write_text("ran")

    atexit.register(parent_hook)
    try:
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
        config = str(tmp_path / "missing" / "config.yaml")
        args = (PY, "-u", "-m", "launcher.worker", config)
        rank = rank_fork._fork("launcher.worker", [config], env, args)
        assert os.getpid() == me  # only the parent comes back from the fork
        assert rank_fork.rank_environment(rank.pid) == {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
        }
        code = rank.wait(timeout=120)
    finally:
        atexit.unregister(parent_hook)
    assert code not in (0, None)  # the config is missing: the worker's own error status
    assert rank_fork.rank_environment(rank.pid) is None  # forgotten once reaped
    assert not marker.exists()


def test_a_run_of_the_users_code_execs_its_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.runners.rank_fork import runs_user_code

    monkeypatch.chdir(tmp_path)  # nothing imported from here
    builtin = tmp_path / "builtin.yaml"
    builtin.write_text("model:\n  _target_: launcher.models.gpt.GPT\ndata:\n  name: reverse\n")
    users = tmp_path / "users.yaml"
    users.write_text("model:\n  _target_: my_project.models.Net\n  d_model: 8\n")
    assert runs_user_code([str(builtin)]) is False
    assert runs_user_code([str(users)]) is True  # its import-time code ran in `launch`
    assert runs_user_code(["not-a-config"]) is True
    (tmp_path / "imported_here.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import imported_here  # noqa: F401

    try:
        assert runs_user_code([str(builtin)]) is True
    finally:
        sys.modules.pop("imported_here", None)


def test_the_preload_imports_deepspeed_for_a_deepspeed_run_only(tmp_path: Path) -> None:
    """The ranks of a DeepSpeed run inherit its import from `launch` instead of each paying it;
    the variables the import sets are not left in `launch`'s environment (a fresh interpreter:
    what this process imported says nothing). DeepSpeed's comm backend then builds no CPU
    shared-memory op (launcher/engines/deepspeed.py: a compile training never uses)."""
    configs = {}
    for engine in ("ddp", "deepspeed"):
        configs[engine] = tmp_path / f"{engine}.yaml"
        configs[engine].write_text(f"engine:\n  name: {engine}\n  zero_stage: 3\n")
    code = textwrap.dedent(
        f"""
        import os, sys
        from launcher.runners.rank_fork import preload
        before = dict(os.environ)
        preload("launcher.worker", [{str(configs["ddp"])!r}])
        print("deepspeed" in sys.modules)
        preload("launcher.worker", [{str(configs["deepspeed"])!r}])
        print("deepspeed" in sys.modules, dict(os.environ) == before)
        from deepspeed.comm.torch import build_shm_op
        print(build_shm_op() is None)
        """
    )
    extensions = tmp_path / "extensions"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)},
    )
    assert proc.stdout.split()[-4:] == ["False", "True", "True", "True"], proc.stdout + proc.stderr
    assert not extensions.exists() or not any(extensions.iterdir())
