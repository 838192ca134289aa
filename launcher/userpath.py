"""The one writer of every file a user names (`launch generate --output FILE`, the sweep summary
files in the sweep directory the user names), and its preflight check.

The rule, as docs/development.md states it:

- A regular file (or a new name) is written into a new hidden temporary file beside it,
  `.NAME.partial-XXXXXXXX` (created with O_EXCL and O_NOFOLLOW, an unpredictable suffix: never
  an existing file, never through a link), synced, given the replaced file's permission bits
  and owner (a new file: 0666 less the umask, as the shell gives), and renamed over NAME. An
  interrupted write leaves the old NAME as it was; on an error the temporary file is removed
  (only it); a kill -9 leaves it behind (`.NAME.partial-*`, never reused nor removed by us).
- A symbolic link is written through to the file it leads to, as a shell's `>` would: the link
  is resolved, the temporary file made beside the resolved file and renamed over it; the link
  stays a link. A dangling link is refused (a shell would create its target).
  Another user's link in a sticky world-writable directory (/tmp) is refused, as the kernel's
  protected_symlinks rule refuses it to a shell.
- A FIFO, a device (/dev/null), a socket and any name under /dev or /proc is written in place
  (renaming over one would replace a device node with a file); a descriptor's name
  (/dev/stdout, /dev/fd/N, /proc/self/fd/N) is that open descriptor, at its offset.
- A directory, a dangling link, a missing or unwritable parent directory and a name the file
  system refuses are one ConfigError whose Fix works as written, raised by `check_output_file`,
  which commands call before their slow part (a model load).
- Nothing else in the directory is read, written, renamed or deleted.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import secrets
import shlex
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from launcher.errors import ConfigError

TEMP_INFIX = ".partial-"
"""The temporary file beside NAME is `.NAME.partial-` and 8 random hex digits."""
_TEMP_EXTRA_BYTES = 2 + len(TEMP_INFIX) + 8
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


def _q(path: Path | str) -> str:
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
                f"give another path, or remove the link first: rm {_q(path)}",
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
            f"give a file path, or move the directory away first: mv {_q(path)} "
            f"{_q(str(path).rstrip('/') + '.old')}",
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
            key, f"the directory {parent} does not exist.", f"mkdir -p {_q(parent)}"
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
    limit = _name_max(parent)
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


def _name_max(directory: Path) -> int:
    try:
        return int(os.pathconf(directory, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


def new_file_mode() -> int:
    """The permission bits a new file gets from open(2) with 0666: the umask taken off. Read from
    /proc (os.umask would change it for every thread for a moment)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _temp_name(name: str, limit: int) -> str:
    """`.NAME.partial-XXXXXXXX`, NAME cut (in bytes) so the whole fits the file system."""
    raw = os.fsencode(name)
    room = max(1, limit - _TEMP_EXTRA_BYTES)
    if len(raw) > room:
        name = raw[:room].decode("utf-8", "ignore") or "output"
    return f".{name}{TEMP_INFIX}{secrets.token_hex(4)}"


def _create_temp(
    directory_fd: int, name: str, limit: int, key: str, where: Path
) -> tuple[str, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        temp = _temp_name(name, limit)
        try:
            return temp, os.open(temp, flags, 0o600, dir_fd=directory_fd)
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(
                key,
                f"cannot create a file in {where} ({exc.strerror}).",
                "give a path in a directory this user can write to.",
            ) from None
    raise ConfigError(key, f"no free temporary name in {where}.", "give another directory.")


@contextlib.contextmanager
def open_output(
    path: Path | str, key: str, *, binary: bool = False, newline: str | None = None
) -> Iterator[IO[Any]]:
    """The file to write `path`'s new content into (text in UTF-8, or bytes), by the rule above.
    Checked again here: the path may have changed since `check_output_file`."""
    target = check_output_file(path, key)
    mode = "wb" if binary else "w"
    text: dict[str, Any] = {} if binary else {"encoding": "utf-8", "newline": newline}
    try:
        if target.way is Way.DESCRIPTOR:  # the open file, at its offset: reopening truncates
            assert target.descriptor is not None
            sys.stdout.flush()
            sys.stderr.flush()
            with open(os.dup(target.descriptor), mode, **text) as out:
                yield out
        elif target.way is Way.IN_PLACE:
            with open(target.path, mode, **text) as out:
                yield out
        else:
            with _replacing(target.path, key, mode, text) as out:
                yield out
    except OSError as exc:  # a full disk: one error, never a traceback
        failed = write_failed(exc, key, str(path), kept=target.way is Way.REPLACE)
        if failed is None:
            raise
        raise failed from None


WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS)
"""A write that fails for the file system's reason (full, over quota or the file size limit)."""


def write_failed(exc: OSError, key: str, where: str, kept: bool = False) -> ConfigError | None:
    """One error naming `key` for a write the file system refused; None for other errors."""
    if exc.errno not in WRITE_ERRNOS:
        return None
    return ConfigError(
        key,
        f"cannot write {where} ({exc.strerror})" + ("; it is as it was." if kept else "."),
        "free space there, or give a path on another file system.",
    )


@contextlib.contextmanager
def _replacing(target: Path, key: str, mode: str, text: dict[str, Any]) -> Iterator[IO[Any]]:
    directory_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        limit = _name_max(target.parent)
        temp, fd = _create_temp(directory_fd, target.name, limit, key, target.parent)
        try:
            with open(fd, mode, **text) as out:
                yield out
                out.flush()
                _take_over_mode(out.fileno(), target.name, directory_fd)
                os.fsync(out.fileno())
            os.rename(temp, target.name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=directory_fd)  # ours, and only ours
            raise
        with contextlib.suppress(OSError):
            os.fsync(directory_fd)  # the rename itself, on disk
    finally:
        os.close(directory_fd)


def _take_over_mode(fd: int, name: str, directory_fd: int) -> None:
    """The replaced file's owner, group and permission bits (a new file: the umask's)."""
    try:
        old = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is None or not stat.S_ISREG(old.st_mode):
        os.fchmod(fd, new_file_mode())
        return
    with contextlib.suppress(OSError):  # another user's file, written by root: still theirs
        os.fchown(fd, old.st_uid, old.st_gid)
    os.fchmod(fd, stat.S_IMODE(old.st_mode) & 0o777)


def write_output(path: Path | str, key: str, data: str | bytes) -> None:
    """`data` as the whole new content of `path`, by the rule above."""
    with open_output(path, key, binary=isinstance(data, bytes)) as out:
        out.write(data)
