"""Where `launch export` writes (launcher/export/output.py): what a killed export leaves beside its
output is tidied by the next export to it, and only that; names the file system refuses are one
error before anything is written. The exports themselves are tests/e2e/test_export.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.export.output import check_output, commit, temporary_sibling
from launcher.export.siblings import OWNER_FILE, _this_process
from tests.unit.test_checkpoint import warnings_seen

__all__ = ["warnings_seen"]  # the fixture, shared with test_checkpoint.py

KILLED_WHILE_WRITING = """
import os, signal, sys
from pathlib import Path
from launcher.export.output import temporary_sibling
tmp = temporary_sibling(Path(sys.argv[1]))
(tmp / "model.safetensors").write_bytes(b"half")
print(tmp, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_export(out: Path) -> Path:
    """A real export process killed (-9) while writing its temporary sibling; that sibling."""
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_WRITING, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return Path(proc.stdout.strip())


def reaped_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def hidden(out: Path, kind: str, pid: int, owner: dict | None) -> Path:
    sibling = out.with_name(f".{out.name}.{kind}-{pid}")
    sibling.mkdir()
    (sibling / "config.json").write_text("{}\n")
    if owner is not None:
        (sibling / OWNER_FILE).write_text(json.dumps(owner) + "\n")
    return sibling


def marked(pid: int, **changes: object) -> dict:
    """The marker a partial directory of process `pid` on this machine carries."""
    return {**_this_process(), "pid": pid, **changes}


def test_a_killed_exports_partial_directory_is_removed_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / "export"
    left = killed_export(out)
    assert left.is_dir() and left.name.startswith(".export.partial-")
    kept = [
        hidden(out, "partial", reaped_pid(), owner=None),  # no marker: not an export's
        hidden(out, "partial", os.getppid(), owner=marked(os.getppid())),  # its process lives
        hidden(out, "partial", pid := reaped_pid(), owner=marked(pid, host="another-node")),
        hidden(out, "partial", pid := reaped_pid(), owner=marked(pid, pid_namespace="pid:[1]")),
    ]
    planted = out.with_name(f".{out.name}.partial-{reaped_pid()}")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / OWNER_FILE).write_text(json.dumps(marked(int(planted.name.split("-")[-1]))))
    planted.symlink_to(victim)  # a link to a directory that looks like a dead export's
    other_output = hidden(tmp_path / "exportX", "partial", pid := reaped_pid(), owner=marked(pid))
    glob_like = tmp_path / "expor?"  # a name with a glob character reaches only its own
    tmp = temporary_sibling(glob_like)
    shutil.rmtree(tmp)
    assert left.is_dir()  # another output's leftover, however its name matches a pattern
    tmp = temporary_sibling(out)
    assert not left.exists()
    assert all(p.is_dir() for p in [*kept, victim, other_output]) and planted.is_symlink()
    commit(tmp, out, overwrite=False, run_dir=tmp_path / "run")
    assert out.is_dir() and not (out / OWNER_FILE).exists()
    assert (victim / OWNER_FILE).is_file()


def test_a_replaced_directory_a_kill_left_aside_is_never_touched(
    tmp_path: Path, warnings_seen: list[str]
) -> None:
    out = tmp_path / "export"
    # Killed between moving the old export aside and renaming the new one into place: it may
    # be the only copy of the earlier export, so the next export only says where it is.
    aside = hidden(out, "old", pid := reaped_pid(), owner=None)
    out.mkdir()  # something (empty) appeared under the name since
    tmp = temporary_sibling(out)
    assert aside.is_dir() and (aside / "config.json").is_file()
    [said] = [w for w in warnings_seen if str(aside) in w]
    assert f"(process {pid})" in said and f"mv {aside} {out}" in said and f"rm -r {aside}" in said
    commit(tmp, out, overwrite=False, run_dir=tmp_path / "run")
    assert aside.is_dir() and out.is_dir()


def test_a_planted_old_sibling_of_this_process_is_refused_before_anything(
    tmp_path: Path,
) -> None:
    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text("{}\n")
    planted = out.with_name(f".{out.name}.old-{os.getpid()}")
    planted.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as refused:
        check_output(out, overwrite=True, run_dir=tmp_path / "run")
    assert f"Fix: move or delete {planted}, then export again." in str(refused.value)
    assert planted.is_symlink() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["export", planted.name])


def test_two_exports_to_one_output_take_turns(tmp_path: Path) -> None:
    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text("{}\n")
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from launcher.export.output import commit, temporary_sibling\n"
        "out = Path(sys.argv[1])\n"
        "for i in range(20):\n"
        "    tmp = temporary_sibling(out)\n"
        "    (tmp / 'config.json').write_text(sys.argv[2])\n"
        "    commit(tmp, out, overwrite=True, run_dir=out.parent / 'run')\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(out), name], stderr=subprocess.PIPE)
        for name in ("a", "b")
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    assert (out / "config.json").read_text() in ("a", "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_an_old_directory_that_cannot_be_removed_is_a_warning_after_the_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings_seen: list[str]
) -> None:
    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text("{}\n")
    tmp = temporary_sibling(out)
    (tmp / "config.json").write_text('{"new": true}\n')
    # Root removes anything here; a removal the file system refuses (a read-only or busy mount)
    # is the one thing this machine cannot produce, so it is the one stand-in.
    real_rmtree = shutil.rmtree

    def refuse_old(path: object, *args: object, **kwargs: object) -> None:
        if ".old-" in str(path):
            raise PermissionError(1, "Operation not permitted", str(path))
        real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shutil, "rmtree", refuse_old)
    commit(tmp, out, overwrite=True, run_dir=tmp_path / "run")
    assert (out / "config.json").read_text() == '{"new": true}\n'
    [old] = [p for p in tmp_path.iterdir() if ".old-" in p.name]
    assert any(f"delete it by hand: rm -r {old}" in w for w in warnings_seen), warnings_seen


def test_a_name_the_file_system_refuses_is_one_error_before_anything(tmp_path: Path) -> None:
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    for out in (
        tmp_path / ("x" * (limit - 10)),
        tmp_path / ("é" * (limit // 2 - 5)),  # fewer characters than the limit, more bytes
        tmp_path / ("y" * (limit + 1)) / "export",
    ):
        with pytest.raises(ConfigError) as refused:
            check_output(out, overwrite=False, run_dir=tmp_path / "run")
        assert refused.value.keys == ["--output"] and "bytes" in str(refused.value)
        assert f"Fix: give a path whose every name is at most {limit} bytes" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        check_output(tmp_path / "a" / "..", overwrite=False, run_dir=tmp_path / "run")
    assert "Fix: give DIR/NAME." in str(refused.value)
    assert list(tmp_path.iterdir()) == []
    fits = tmp_path / ("z" * (limit - 20))
    check_output(fits, overwrite=False, run_dir=tmp_path / "run")
    commit(temporary_sibling(fits), fits, overwrite=False, run_dir=tmp_path / "run")
    assert fits.is_dir()
