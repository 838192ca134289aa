"""The launcher's own files inside a directory the user named (a run directory, the data cache):
never opened through a symbolic link.

A run directory is the user's, but `config.yaml`, `metrics.jsonl`, `summary.json`, ... in it are
the launcher's. A link where the launcher writes one of them is refused, with one ConfigError that
names the path and the fix (`rm` the link), before anything is written (`refuse_link`, called on
every name by launcher/rundir.py's check_own_files); the writes check again, so a link planted
later is never followed either:

- `replace_own` replaces a file whole the way launcher/userpath/named.py replaces a user's file
  (a new hidden `.NAME.partial-XXXXXXXX`, O_EXCL | O_NOFOLLOW, synced, renamed over NAME); a link
  planted between its check and its rename is replaced by the rename, never followed;
- `open_own` opens an appended log or a lock with O_NOFOLLOW | O_CREAT (never truncating unless
  asked): a link there fails inside open(2) itself, with no window; a directory or a FIFO there is
  refused too (a FIFO is never waited on).

A link to a directory (checkpoints/ moved to a larger disk) is where the user put that directory
and is followed.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from launcher.errors import ConfigError
from launcher.userpath.check import quoted
from launcher.userpath.named import replacing

RUN_DIR_KEY = "hydra.run.dir"


def refuse_link(path: Path | str, key: str = RUN_DIR_KEY) -> None:
    """One ConfigError naming `key` when a symbolic link stands where the launcher writes its own
    file."""
    if os.path.islink(path):
        raise ConfigError(
            key,
            f"{path} is a symbolic link; the launcher writes its own file there and never "
            "through a link.",
            f"remove the link (what it leads to stays as it is): rm {quoted(path)}",
        )


def replace_own(
    path: Path | str, data: str, key: str = RUN_DIR_KEY, bits: int | None = None
) -> None:
    """The launcher's own file `path` replaced whole by `data` (UTF-8), a link there refused.
    `bits`: the permission bits (else the replaced file's, or 0666 less the umask)."""
    refuse_link(path, key)
    with replacing(Path(os.path.abspath(path)), key, "w", {"encoding": "utf-8"}, bits) as out:
        out.write(data)


def open_own(
    path: Path | str,
    key: str = RUN_DIR_KEY,
    flags: int = os.O_WRONLY | os.O_APPEND,
    mode: int = 0o666,
) -> int:
    """A descriptor of the launcher's own file `path` (an appended log, a lock), created if
    missing (`mode` less the umask), opened with O_NOFOLLOW: a link, a directory or a FIFO there
    is one ConfigError."""
    always = os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | always, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refuse_link(path, key)
        if exc.errno not in (errno.ENXIO, errno.EISDIR):  # a FIFO without a reader, a directory
            raise
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise ConfigError(
            key,
            f"{path} is not a regular file; the launcher keeps its own file there.",
            f"move it away: mv {quoted(path)} {quoted(f'{path}.old')}",
        )
    return fd
