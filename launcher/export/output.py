"""Where an export is written: a temporary sibling of the output directory, renamed into place
when complete, so an interrupted export never leaves a half-written directory under the name
asked for, and never destroys what was there. Only a real directory is ever replaced (with
export.overwrite=true); a symlink, a device or a file given as --output is refused.

The siblings are hidden (`.NAME.partial-PID` while written, `.NAME.old-PID` for the directory
being replaced) and each carries a file naming the process that made it. A later export to the
same output tidies what a killed one (kill -9) left: a partial directory is removed, and a
replaced directory is put back if the new one never got into place, else removed. Only those
siblings are touched, and only when their process is gone."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from launcher.errors import ConfigError
from launcher.logs import get_logger

log = get_logger("export")

KEY = "--output"
RECORD_FILE = "launcher_export.json"  # in every export: what a later overwrite may replace
OWNER_FILE = ".launcher_export_owner"  # in a hidden sibling: the process id that made it
PARTIAL, OLD = "partial", "old"
_SUFFIX_ROOM = 32  # ".", ".partial-" and a process id, within the file system's name limit


def check_output(path: Path, overwrite: bool, run_dir: Path) -> None:
    """Refuse an output the export may not write to, before any weight is read."""
    _check_name_length(path)
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


def _check_name_length(path: Path) -> None:
    """Names the file system refuses, named before anything is written (os.stat's ENAMETOOLONG
    was a traceback)."""
    try:
        limit = os.pathconf(_existing_ancestor(path), "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    too_long = [part for part in path.parts[:-1] if len(part) > limit]
    if len(path.name) > limit - _SUFFIX_ROOM:
        too_long.append(path.name)
    if too_long:
        name = too_long[0]
        raise ConfigError(
            KEY,
            f"the name {name[:40]}... is {len(name)} characters; this file system allows {limit}, "
            f"and the export's own directory needs {_SUFFIX_ROOM} of them for its temporary "
            "sibling.",
            f"give a path whose every name is at most {limit} characters, and the last at most "
            f"{limit - _SUFFIX_ROOM}.",
        )


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        try:
            if candidate.is_dir():
                return candidate
        except OSError:
            continue
    return Path("/")


def _sibling(path: Path, kind: str, pid: int) -> Path:
    return path.with_name(f".{path.name}.{kind}-{pid}")


def _owner(directory: Path) -> int | None:
    """The process id recorded in a hidden sibling this module made; None for anything else."""
    if directory.is_symlink() or not directory.is_dir():
        return None
    try:
        return int((directory / OWNER_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tidy_leftovers(path: Path) -> None:
    """What killed exports to `path` left beside it: a partial directory is removed; a directory
    moved aside to be replaced goes back when nothing took its place, else it is removed."""
    try:
        siblings = list(path.parent.glob(f".{path.name}.*-*"))
    except OSError:
        return
    for sibling in sorted(siblings):
        kind, _, pid = sibling.name[len(path.name) + 2 :].partition("-")
        if kind not in (PARTIAL, OLD) or not pid.isdigit():
            continue
        owner = int(pid)
        if _owner(sibling) != owner or (owner != os.getpid() and _alive(owner)):
            continue  # not ours, or its export still runs (our own id: an earlier process's)
        if kind == OLD and not os.path.lexists(path):
            (sibling / OWNER_FILE).unlink()
            sibling.rename(path)
            log.warning(f"put back {path}, which a killed export had moved to {sibling.name}.")
            continue
        shutil.rmtree(sibling, ignore_errors=True)
        log.info(f"removed {sibling}, left by a killed export (process {pid}).")


def temporary_sibling(path: Path) -> Path:
    """A new hidden directory beside `path`, marked as this process's."""
    tidy_leftovers(path)
    tmp = _sibling(path, PARTIAL, os.getpid())
    try:
        tmp.mkdir()
    except FileExistsError:
        raise ConfigError(
            KEY,
            f"{tmp} exists, and no export made it.",
            f"move or delete {tmp}, then export again.",
        ) from None
    (tmp / OWNER_FILE).write_text(f"{os.getpid()}\n")
    return tmp


def commit(tmp: Path, path: Path, overwrite: bool, run_dir: Path) -> None:
    """Rename the complete export into place; an existing directory (checked again: it may have
    changed while the weights were written) is moved aside first and removed after."""
    check_output(path, overwrite, run_dir)
    (tmp / OWNER_FILE).unlink()
    _usual_modes(tmp)
    if not path.exists():
        tmp.rename(path)
        return
    old = _sibling(path, OLD, os.getpid())
    # Marked first, so that a kill between the renames leaves it recoverable (tidy_leftovers).
    (path / OWNER_FILE).write_text(f"{os.getpid()}\n")
    path.rename(old)
    tmp.rename(path)
    try:
        shutil.rmtree(old)
    except OSError as exc:
        log.warning(
            f"the export is in place, but the directory it replaced, moved to {old}, could not "
            f"be removed ({exc.strerror or exc}); delete it by hand: rm -r '{old}'"
        )


def _usual_modes(directory: Path) -> None:
    """Files as any other file the user creates (0666 less the umask): safetensors writes its
    files 0600, which other users of a shared model directory could not read."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)
