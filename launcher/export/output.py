"""Where an export is written: a temporary sibling of the output directory, renamed into place
when complete, so an interrupted export never leaves a half-written directory under the name
asked for, and never destroys what was there. Only a real directory is ever replaced (with
export.overwrite=true), keeping its permission bits; a symlink, a device or a file given as
--output is refused. (The rule for user-named files is launcher/userpath; a directory output
has its own here, with the same hidden `.NAME.partial-` naming and nothing else touched.)

The hidden siblings, what a killed export leaves of them and the lock that keeps two exports to
one output apart are launcher/export/siblings.py."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
from pathlib import Path

from launcher.errors import ConfigError
from launcher.export.siblings import (
    KEY,
    OLD,
    SUFFIX_BYTES,
    finish_partial,
    make_partial,
    output_lock,
    sibling,
)
from launcher.logs import get_logger
from launcher.userpath import new_file_mode

log = get_logger("export")

RECORD_FILE = "launcher_export.json"  # in every export: what a later overwrite may replace


def check_output(path: Path, overwrite: bool, run_dir: Path) -> None:
    """Refuse an output the export may not write to, before any weight is read."""
    _check_name_length(path)
    _check_outside_the_run(path, run_dir)
    old = sibling(path, OLD)
    if os.path.lexists(old):
        raise ConfigError(
            KEY,
            f"{old} exists, and this export did not make it (it would move {path} there).",
            f"move or delete {shlex.quote(str(old))}, then export again.",
        )
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


def _check_name_length(path: Path) -> None:
    """Names the file system refuses (it counts bytes), and `..` as the last name, before
    anything is written: os.stat's ENAMETOOLONG was a traceback."""
    if path.name in ("", ".", ".."):
        raise ConfigError(KEY, f"{path} does not name a directory of its own.", "give DIR/NAME.")
    try:
        limit = os.pathconf(_existing_ancestor(path), "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    sizes = [len(os.fsencode(part)) for part in path.parts]
    too_long = [p for p, n in zip(path.parts[:-1], sizes[:-1], strict=True) if n > limit]
    if sizes[-1] > limit - SUFFIX_BYTES:
        too_long.append(path.name)
    if too_long:
        name = too_long[0]
        raise ConfigError(
            KEY,
            f"the name {name[:40]}... is {len(os.fsencode(name))} bytes; this file system allows "
            f"{limit}, and the export's own directory needs {SUFFIX_BYTES} of them for its "
            "temporary sibling.",
            f"give a path whose every name is at most {limit} bytes, and the last at most "
            f"{limit - SUFFIX_BYTES}.",
        )


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        try:
            if candidate.is_dir():
                return candidate
        except OSError:
            continue
    return Path("/")


def temporary_sibling(path: Path) -> Path:
    """A new hidden directory beside `path` to write the export into (siblings.py)."""
    with output_lock(path):
        return make_partial(path)


def commit(tmp: Path, path: Path, overwrite: bool, run_dir: Path) -> None:
    """Rename the complete export into place; an existing directory (checked again: it may have
    changed while the weights were written) is moved aside first and removed after."""
    with output_lock(path):
        check_output(path, overwrite, run_dir)
        _usual_modes(tmp)
        if not path.exists():
            tmp.rename(path)
            finish_partial(path)
            return
        old = sibling(path, OLD)  # absent: check_output refuses one that exists
        tmp.chmod(stat.S_IMODE(path.stat().st_mode))  # a private (0700) export stays private
        path.rename(old)
        tmp.rename(path)
        finish_partial(path)
    try:
        shutil.rmtree(old)
    except OSError as exc:
        log.warning(
            f"the export is in place, but the directory it replaced, moved to {old}, could not "
            f"be removed ({exc.strerror or exc}); delete it by hand: rm -r {shlex.quote(str(old))}"
        )


def _usual_modes(directory: Path) -> None:
    """Files as any other file the user creates (0666 less the umask): safetensors writes its
    files 0600, which other users of a shared model directory could not read."""
    mode = new_file_mode()
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)
