"""Files a user names (`launch generate --output FILE`, the sweep summaries in the sweep
directory the user names): the one writer and its preflight check, by this rule:

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
import errno
import os
import secrets
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from launcher.errors import ConfigError
from launcher.userpath.check import (
    TEMP_EXTRA_BYTES,
    TEMP_INFIX,
    Way,
    check_output_file,
    name_max,
)


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
    room = max(1, limit - TEMP_EXTRA_BYTES)
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
            with replacing(target.path, key, mode, text) as out:
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
def replacing(
    target: Path, key: str, mode: str, text: dict[str, Any], bits: int | None = None
) -> Iterator[IO[Any]]:
    """`target` replaced by a new hidden file of its own, renamed over it (never followed)."""
    directory_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        limit = name_max(target.parent)
        temp, fd = _create_temp(directory_fd, target.name, limit, key, target.parent)
        try:
            with open(fd, mode, **text) as out:
                yield out
                out.flush()
                _take_over_mode(out.fileno(), target.name, directory_fd)
                if bits is not None:
                    os.fchmod(out.fileno(), bits)
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
