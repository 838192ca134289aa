"""Files a user left beside an output path, and the proof that a command writing that path did not
touch them (launcher/userpath's rule: nothing else in the directory is read, written, renamed
or deleted). A planted `FILE.partial` is a regular file, or a symbolic link to a file elsewhere."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    kind: str
    content: bytes | str  # a file's bytes, a link's target
    mtime_ns: int
    mode: int
    inode: int


def entry(path: Path) -> Entry:
    status = os.lstat(path)
    if path.is_symlink():
        return Entry("link", os.readlink(path), status.st_mtime_ns, status.st_mode, status.st_ino)
    if path.is_dir():
        return Entry("dir", "", status.st_mtime_ns, status.st_mode, status.st_ino)
    return Entry("file", path.read_bytes(), status.st_mtime_ns, status.st_mode, status.st_ino)


def snapshot(*directories: Path) -> dict[Path, Entry]:
    return {path: entry(path) for folder in directories for path in sorted(folder.iterdir())}


class Planted:
    """`FILE.partial` beside each output FILE: a regular file (`as_link=False`) or a link to a
    file in `elsewhere`. `unchanged(*written)` asserts that everything in those directories is as
    it was, but the paths named (the outputs)."""

    def __init__(self, outputs: Path | list[Path], elsewhere: Path, as_link: bool) -> None:
        outputs = [outputs] if isinstance(outputs, Path) else outputs
        elsewhere.mkdir(parents=True, exist_ok=True)
        for output in outputs:
            partial = output.with_name(output.name + ".partial")
            outside = elsewhere / f"someone_elses_{output.name}"
            outside.write_text("not yours\n")
            if as_link:
                partial.symlink_to(outside)
            else:
                partial.write_text("my own notes\n")
            os.utime(partial, ns=(1_000_000_000, 1_000_000_000), follow_symlinks=False)
            os.utime(outside, ns=(1_000_000_000, 1_000_000_000))
        self.folders = sorted({*(output.parent for output in outputs), elsewhere})
        self.before = snapshot(*self.folders)

    def unchanged(self, *written: Path) -> None:
        after = snapshot(*self.folders)
        allowed = set(written)
        assert set(after) - allowed == set(self.before) - allowed, sorted(after)
        for path, was in self.before.items():
            if path not in allowed:
                assert after[path] == was, (path, was, after[path])
