"""Where `launch export` writes (launcher/export/output.py): what a killed export leaves beside its
output is tidied by the next export to it, and only that; names the file system refuses are one
error before anything is written. The exports themselves are tests/e2e/test_export.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.export.output import OWNER_FILE, check_output, commit, temporary_sibling
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


def hidden(out: Path, kind: str, pid: int, owner: int | None) -> Path:
    sibling = out.with_name(f".{out.name}.{kind}-{pid}")
    sibling.mkdir()
    (sibling / "config.json").write_text("{}\n")
    if owner is not None:
        (sibling / OWNER_FILE).write_text(f"{owner}\n")
    return sibling


def test_a_killed_exports_partial_directory_is_removed_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / "export"
    left = killed_export(out)
    assert left.is_dir() and left.name.startswith(".export.partial-")
    not_ours = hidden(out, "partial", reaped_pid(), owner=None)  # no owner file: someone's
    running = hidden(out, "partial", os.getppid(), owner=os.getppid())  # its process lives
    tmp = temporary_sibling(out)
    assert not left.exists()
    assert not_ours.is_dir() and running.is_dir()  # never touched
    commit(tmp, out, overwrite=False, run_dir=tmp_path / "run")
    assert out.is_dir() and not (out / OWNER_FILE).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["export", not_ours.name, running.name]
    )


def test_a_replaced_directory_a_kill_left_aside_is_put_back_or_removed(tmp_path: Path) -> None:
    out = tmp_path / "export"
    # Killed between moving the old export aside and renaming the new one into place.
    aside = hidden(out, "old", pid := reaped_pid(), owner=pid)
    shutil.rmtree(temporary_sibling(out))
    assert out.is_dir() and not aside.exists()  # the earlier export is back under its name
    assert (out / "config.json").is_file() and not (out / OWNER_FILE).exists()
    # Killed after the new one was in place: the old one is only removed.
    aside = hidden(out, "old", pid := reaped_pid(), owner=pid)
    tmp = temporary_sibling(out)
    assert not aside.exists() and out.is_dir()
    (tmp / "config.json").write_text('{"new": true}\n')
    commit(tmp, out, overwrite=True, run_dir=tmp_path / "run")
    assert (out / "config.json").read_text() == '{"new": true}\n'
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
    assert any(f"delete it by hand: rm -r '{old}'" in w for w in warnings_seen), warnings_seen


def test_a_name_the_file_system_refuses_is_one_error_before_anything(tmp_path: Path) -> None:
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    for out in (tmp_path / ("x" * (limit - 10)), tmp_path / ("y" * (limit + 1)) / "export"):
        with pytest.raises(ConfigError) as refused:
            check_output(out, overwrite=False, run_dir=tmp_path / "run")
        assert refused.value.keys == ["--output"] and "characters" in str(refused.value)
        assert f"Fix: give a path whose every name is at most {limit} characters" in str(
            refused.value
        )
    assert list(tmp_path.iterdir()) == []
    fits = tmp_path / ("z" * (limit - 32))
    check_output(fits, overwrite=False, run_dir=tmp_path / "run")
    commit(temporary_sibling(fits), fits, overwrite=False, run_dir=tmp_path / "run")
    assert fits.is_dir()
