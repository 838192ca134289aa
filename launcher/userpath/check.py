"""The preflight of a file the user names (the rule: named.py): what the path is (a regular file
or a new name to replace, a link to write through, a device or FIFO to write in place, an open
descriptor), refused with one ConfigError whose Fix works as written when it cannot be written."""

from __future__ import annotations

import enum
import os
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import ConfigError

TEMP_INFIX = ".partial-"
"""The temporary file beside NAME is `.NAME.partial-` and 8 random hex digits."""
TEMP_EXTRA_BYTES = 2 + len(TEMP_INFIX) + 8
_DESCRIPTORS = {"/dev/stdout": 1, "/dev/stderr": 2}
_DESCRIPTOR_FOLDERS = ("/dev/fd/", "/proc/self/fd/")


class Way(enum.Enum):
    REPLACE = "replace"  # a regular file or a new name: temporary file, rename
    IN_PLACE = "in place"  # a FIFO, a device, a socket, a name under /dev or /proc
    DESCRIPTOR = "descriptor"  # /dev/stdout, /dev/fd/N: the open descriptor itself


@dataclass(frozen=True)
class OutputTarget:
    """How a user-named path is written. `path`: the file replaced (a link resolved), or the name
    opened in place; `descriptor`: the descriptor a /dev/fd/N name stands for."""

    way: Way
    path: Path
    descriptor: int | None = None


def quoted(path: Path | str) -> str:
    return shlex.quote(str(path))


def descriptor_of(path: Path) -> int | None:
    """The descriptor a path such as /dev/stdout or /dev/fd/3 names, or None."""
    spelled = os.path.abspath(path)
    if spelled in _DESCRIPTORS:
        return _DESCRIPTORS[spelled]
    for folder in _DESCRIPTOR_FOLDERS:
        number = spelled.removeprefix(folder)
        if number != spelled and number.isdigit():
            return int(number)
    return None


def _system_name(path: Path) -> bool:
    """A name under /dev or /proc: an open descriptor's or a device's, never a file to replace
    (`--output /dev/stdout` inside `> out.txt` leads to out.txt, which the shell holds open)."""
    return Path(os.path.abspath(path)).parts[1:2] in (("dev",), ("proc",))


def check_output_file(path: Path | str, key: str) -> OutputTarget:
    """Where and how `path` will be written; one ConfigError naming `key` when it cannot be.
    Reads nothing but the path's own status and its parent's; changes nothing."""
    path = Path(path)
    descriptor = descriptor_of(path)
    if descriptor is not None:
        try:
            os.fstat(descriptor)
        except OSError:
            raise ConfigError(
                key,
                f"{path} names descriptor {descriptor}, which is not open.",
                "give a file path.",
            ) from None
        return OutputTarget(Way.DESCRIPTOR, path, descriptor)
    _refuse_planted_links(path, key)
    try:
        status = os.stat(path)  # follows links: what a write would reach
    except FileNotFoundError:
        status = None
    except OSError as exc:  # a link loop, a name too long, a parent that is a file
        raise ConfigError(
            key, f"cannot use {path} ({exc.strerror}).", "give another file path."
        ) from None
    if status is None:
        if os.path.islink(path):
            raise ConfigError(
                key,
                f"{path} is a symbolic link to {os.readlink(path)}, which does not exist.",
                f"give another path, or remove the link first: rm {quoted(path)}",
            )
        if _system_name(path):
            raise ConfigError(
                key,
                f"{path} does not exist (only an existing name under /dev or /proc is written).",
                "give a file path outside /dev and /proc.",
            )
        target = Path(os.path.abspath(path))
        _check_parent(target, key)
        return OutputTarget(Way.REPLACE, target)
    if stat.S_ISDIR(status.st_mode):
        raise ConfigError(
            key,
            f"{path} is a directory.",
            f"give a file path, or move the directory away first: mv {quoted(path)} "
            f"{quoted(str(path).rstrip('/') + '.old')}",
        )
    if stat.S_ISREG(status.st_mode) and not _system_name(path):
        target = Path(os.path.realpath(path))  # a link: its file is replaced, as `>` writes it
        _check_parent(target, key)
        return OutputTarget(Way.REPLACE, target)
    if not os.access(path, os.W_OK):
        raise ConfigError(key, f"{path} is not writable.", "give a path this user can write.")
    return OutputTarget(Way.IN_PLACE, path)


def _refuse_planted_links(path: Path, key: str) -> None:
    """The kernel's protected_symlinks rule, applied whatever the sysctl says (the link is
    resolved here, not by open(2)): a link in a sticky world-writable directory (/tmp) is followed
    only when this user or the directory's owner owns it, so that another user's planted
    `/tmp/out.jsonl -> /etc/passwd` is not written through by root."""
    for _ in range(40):  # the kernel's own limit on links followed
        try:
            link = os.lstat(path)
            if not stat.S_ISLNK(link.st_mode):
                return
            folder = os.stat(path.parent)
        except OSError:
            return  # os.stat below names the problem
        shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & stat.S_IWOTH
        if shared and link.st_uid not in (os.geteuid(), folder.st_uid):
            raise ConfigError(
                key,
                f"{path} is a symbolic link owned by another user (uid {link.st_uid}) in the "
                f"shared directory {path.parent}; it is not followed (another user's link there "
                "could lead anywhere).",
                "give a path in a directory of your own.",
            )
        path = path.parent / os.readlink(path)


def _check_parent(target: Path, key: str) -> None:
    parent = target.parent
    try:
        status = os.stat(parent)
    except FileNotFoundError:
        raise ConfigError(
            key, f"the directory {parent} does not exist.", f"mkdir -p {quoted(parent)}"
        ) from None
    except OSError as exc:
        raise ConfigError(
            key, f"cannot use {parent} ({exc.strerror}).", "give a path in another directory."
        ) from None
    if not stat.S_ISDIR(status.st_mode):
        raise ConfigError(
            key, f"{parent} is not a directory.", "give a path inside an existing directory."
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            key,
            f"cannot create files in {parent} (not writable by this user"
            + (", a read-only file system" if _read_only(parent) else "")
            + ").",
            "give a path in a directory this user can write to.",
        )
    limit = name_max(parent)
    if len(os.fsencode(target.name)) > limit:
        raise ConfigError(
            key,
            f"the name {target.name[:40]}... is {len(os.fsencode(target.name))} bytes; this "
            f"file system allows {limit}.",
            f"give a file name of at most {limit} bytes.",
        )


def _read_only(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def name_max(directory: Path) -> int:
    try:
        return int(os.pathconf(directory, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255
