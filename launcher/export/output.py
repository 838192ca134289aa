"""Where an export is written: a temporary sibling of the output directory, renamed into place
when complete, so an interrupted export never leaves a half-written directory under the name
asked for, and never destroys what was there. Only a real directory is ever replaced (with
export.overwrite=true); a symlink, a device or a file given as --output is refused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from launcher.errors import ConfigError

KEY = "--output"
RECORD_FILE = "launcher_export.json"  # in every export: what a later overwrite may replace


def check_output(path: Path, overwrite: bool, run_dir: Path) -> None:
    """Refuse an output the export may not write to, before any weight is read."""
    _check_outside_the_run(path, run_dir)
    if path.is_symlink():
        raise ConfigError(
            KEY,
            f"{path} is a symbolic link; the export replaces a directory only.",
            "give a new directory path (--output DIR).",
        )
    if path.exists() and not path.is_dir():
        raise ConfigError(
            KEY, f"{path} exists and is not a directory.", "give a new directory path."
        )
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ConfigError(
            [KEY, "export.overwrite"],
            f"{path} is not empty.",
            "give a new directory (--output DIR), or add export.overwrite=true to replace it.",
        )
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(KEY, f"cannot create {parent} ({exc.strerror}).") from None
    if not os.access(parent, os.W_OK):
        raise ConfigError(KEY, f"{parent} is not writable.", "give a writable path.")


def _check_outside_the_run(path: Path, run_dir: Path) -> None:
    """The run being exported is never replaced: not the run directory, nor one that holds it,
    nor anything of the run's inside it but an earlier export (RUN/export, the default)."""
    out, run = Path(os.path.realpath(path)), Path(os.path.realpath(run_dir))
    if out == run or out in run.parents:
        raise ConfigError(
            KEY,
            f"{path} holds the run being exported ({run_dir}); writing there would replace it.",
            f"give a directory outside it, or leave --output out (the default {run_dir}/export).",
        )
    inside = run in out.parents
    if inside and path.exists() and not (path / RECORD_FILE).is_file():
        raise ConfigError(
            KEY,
            f"{path} is part of the run being exported, not an earlier export.",
            f"give a new directory, or leave --output out (the default {run_dir}/export).",
        )


def temporary_sibling(path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # ours: a leftover of this process id
    tmp.mkdir()
    return tmp


def commit(tmp: Path, path: Path, overwrite: bool, run_dir: Path) -> None:
    """Rename the complete export into place; an existing directory (checked again: it may have
    changed while the weights were written) is moved aside first and removed after."""
    check_output(path, overwrite, run_dir)
    _usual_modes(tmp)
    if not path.exists():
        tmp.rename(path)
        return
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old)


def _usual_modes(directory: Path) -> None:
    """Files as any other file the user creates (0666 less the umask): safetensors writes its
    files 0600, which other users of a shared model directory could not read."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)
