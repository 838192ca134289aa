"""The one writer of user-named files (launcher/userpath): a temporary file of its own beside
the target, renamed over it; the replaced file's permission bits; a link written through to its
file; special files in place; one error for what cannot be written, before anything; nothing
else in the directory touched. The commands that use it: tests/e2e/test_generate_output_file.py,
tests/unit/test_sweep_summary.py."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.userpath import (
    TEMP_INFIX,
    Way,
    check_output_file,
    new_file_mode,
    open_output,
    write_output,
)
from tests.helpers import REPO
from tests.planted import Planted

KEY = "--output"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("as_link", [False, True], ids=["partial-file", "partial-link"])
def test_a_planted_partial_is_untouched_new_and_replaced(tmp_path: Path, as_link: bool) -> None:
    out = tmp_path / "out" / "answers.jsonl"
    out.parent.mkdir()
    planted = Planted(out, tmp_path / "elsewhere", as_link)
    write_output(out, KEY, "new\n")
    assert out.read_text() == "new\n" and _mode(out) == new_file_mode()
    planted.unchanged(out)
    write_output(out, KEY, "newer\n")  # replacing an existing file
    assert out.read_text() == "newer\n"
    planted.unchanged(out)


def test_the_replaced_files_permission_bits_are_kept(tmp_path: Path) -> None:
    out = tmp_path / "secret.jsonl"
    out.write_text("old\n")
    out.chmod(0o600)
    write_output(out, KEY, "new\n")
    assert out.read_text() == "new\n" and _mode(out) == 0o600
    out.chmod(0o640)
    write_output(out, KEY, b"bytes\n")
    assert out.read_bytes() == b"bytes\n" and _mode(out) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.jsonl"]


def test_a_link_is_written_through_to_its_file_as_a_shell_would(tmp_path: Path) -> None:
    real = tmp_path / "data" / "real.jsonl"
    real.parent.mkdir()
    real.write_text("old\n")
    real.chmod(0o600)
    link = tmp_path / "link.jsonl"
    link.symlink_to(Path("data") / "real.jsonl")  # relative, as users make them
    assert check_output_file(link, KEY).path == real
    write_output(link, KEY, "new\n")
    assert link.is_symlink() and os.readlink(link) == os.path.join("data", "real.jsonl")
    assert real.read_text() == "new\n" and _mode(real) == 0o600
    assert sorted(p.name for p in real.parent.iterdir()) == ["real.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "link.jsonl"]


def _refusal(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as refused:
        check_output_file(path, KEY)
    assert refused.value.keys == [KEY]
    return refused.value


def test_what_cannot_be_written_is_one_error_whose_fix_works(tmp_path: Path) -> None:
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "gone" / "nothing.jsonl")
    error = _refusal(dangling)
    assert "does not exist" in error.problem and error.fix.endswith(f"rm {dangling}")
    assert (tmp_path / "gone").exists() is False  # no directory made for it
    assert "is a directory" in _refusal(tmp_path).problem
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert "Not a directory" in _refusal(a_file / "out.jsonl").problem
    missing = tmp_path / "new" / "deeper" / "out.jsonl"
    error = _refusal(missing)
    assert "does not exist" in error.problem and error.fix == f"mkdir -p {missing.parent}"
    # Each Fix as printed:
    subprocess.run(["bash", "-c", error.fix], check=True)
    assert check_output_file(missing, KEY).way is Way.REPLACE
    subprocess.run(["bash", "-c", _refusal(dangling).fix.split("first: ")[1]], check=True)
    assert check_output_file(dangling, KEY).way is Way.REPLACE
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert "Too many levels of symbolic links" in _refusal(loop).problem
    assert "only an existing name" in _refusal(Path("/dev/launcher-no-such-node")).problem
    assert not Path("/dev/launcher-no-such-node").exists()


UNWRITABLE = """
import os, sys
from launcher.errors import ConfigError
from launcher.userpath import check_output_file
if os.geteuid() == 0:  # imported first: the interpreter's own files may be root's only
    os.setgid(65534); os.setuid(65534)
try:
    check_output_file(sys.argv[1], "--output")
except ConfigError as exc:
    print(exc)
"""


def test_an_unwritable_directory_is_one_error() -> None:
    """As a user who may not write there (root may write anywhere but a read-only mount). In the
    temporary directory itself: pytest's own folders are root's only, not even searchable."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        folder.chmod(0o755)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, "-c", UNWRITABLE, str(folder / "out.jsonl")],
            capture_output=True, text=True, env=env, cwd="/", timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert (
            f"--output: cannot create files in {folder} (not writable by this user). "
            "Fix: give a path in a directory this user can write to." in proc.stdout
        ), proc.stdout
        assert list(folder.iterdir()) == []


def test_an_error_while_writing_removes_only_its_own_temporary_file(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    planted = Planted(out, tmp_path / "elsewhere", as_link=False)
    with pytest.raises(RuntimeError), open_output(out, KEY) as f:
        f.write("half")
        [temp] = [p for p in tmp_path.iterdir() if TEMP_INFIX in p.name]
        assert temp.name.startswith(".out.jsonl.partial-") and _mode(temp) == 0o600
        raise RuntimeError("the model failed")
    assert out.read_text() == "old\n"
    planted.unchanged()


KILLED_WHILE_WRITING = """
import os, signal, sys
from launcher.userpath import open_output
with open_output(sys.argv[1], "--output") as out:
    out.write("half a line")
    out.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_kill_mid_write_leaves_the_old_file_intact(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    planted = Planted(out, tmp_path / "elsewhere", as_link=True)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_WRITING, str(out)], cwd=REPO, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL
    assert out.read_text() == "old\n"
    [left] = [p for p in tmp_path.iterdir() if TEMP_INFIX in p.name]
    assert left.read_text() == "half a line"
    planted.unchanged(left)


def test_temporary_names_are_unpredictable_and_fit_the_file_system(tmp_path: Path) -> None:
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    names = []
    for name in ("a.jsonl", "é" * (limit // 2)):
        out = tmp_path / name
        with open_output(out, KEY) as f:
            names.append(next(p.name for p in tmp_path.iterdir() if TEMP_INFIX in p.name))
            f.write("x")
        assert out.read_text() == "x"
    with open_output(tmp_path / "a.jsonl", KEY):
        again = next(p.name for p in tmp_path.iterdir() if TEMP_INFIX in p.name)
    assert again != names[0] and again.startswith(".a.jsonl.partial-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["a.jsonl", "é" * (limit // 2)])


def test_special_files_and_descriptors_are_written_in_place(tmp_path: Path) -> None:
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    write_output(null, KEY, "gone\n")
    assert stat.S_ISCHR(null.stat().st_mode)
    read, write = os.pipe()
    try:
        assert check_output_file(f"/dev/fd/{write}", KEY).way is Way.DESCRIPTOR
        write_output(f"/dev/fd/{write}", KEY, "through the pipe\n")
        assert os.read(read, 100) == b"through the pipe\n"
    finally:
        os.close(read)
        os.close(write)
    assert "not open" in _refusal(Path("/dev/fd/987")).problem
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


OVER_THE_FILE_SIZE_LIMIT = """
import resource, signal, sys
from launcher.errors import ConfigError
from launcher.userpath import open_output
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, as a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    with open_output(sys.argv[1], "--output") as out:
        out.write("x" * 100_000)
except ConfigError as exc:
    print(exc)
"""


def test_a_full_file_system_is_one_error_and_the_old_file_stays(tmp_path: Path) -> None:
    """A disk that fills up (here the file size limit, EFBIG) was a traceback: one error now,
    the old file as it was, the temporary file gone, nothing else touched."""
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    planted = Planted(out, tmp_path / "elsewhere", as_link=True)
    proc = subprocess.run(
        [sys.executable, "-c", OVER_THE_FILE_SIZE_LIMIT, str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"--output: cannot write {out} (File too large); it is as it was." in proc.stdout
    assert "Fix: free space there" in proc.stdout
    assert out.read_text() == "old\n"
    assert not [p for p in tmp_path.iterdir() if TEMP_INFIX in p.name]
    planted.unchanged()
    with pytest.raises(ConfigError, match=r"cannot write /dev/full \(No space left on device\)"):
        write_output("/dev/full", KEY, "x" * 100_000)  # a device: written in place


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's link needs root")
def test_another_users_link_in_a_shared_directory_is_not_followed(tmp_path: Path) -> None:
    """The kernel's protected_symlinks rule (off in some containers, and bypassed anyway since the
    link is resolved here, not by open(2)): another user's `/tmp/out.jsonl -> victim` was written
    through by root. Our own link, or the directory owner's, still is."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    link = shared / "out.jsonl"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)  # planted by nobody
    hop = shared / "hop.jsonl"
    hop.symlink_to(link)  # ours, leading to theirs
    for name in (link, hop):
        with pytest.raises(ConfigError, match=r"owned by another user \(uid 65534\)") as refused:
            write_output(name, KEY, "new\n")
        assert "Fix: give a path in a directory of your own." in str(refused.value)
    assert victim.read_text() == "secret\n" and link.is_symlink()
    os.lchown(link, os.geteuid(), os.getegid())
    write_output(hop, KEY, "new\n")
    assert victim.read_text() == "new\n" and link.is_symlink() and hop.is_symlink()
