"""`launch generate --output FILE` by launcher/userpath's rule (issue 33, item 4): a planted
FILE.partial (a file, or a link to a file elsewhere) is untouched; a 0600 FILE stays 0600; a link
is written through to its file; a dangling link, a directory, a missing parent is one line and
exit 2 before the model loads; a kill mid-write leaves the old FILE as it was."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from launcher.userpath import TEMP_INFIX, new_file_mode
from tests.e2e.serve_run import shared_run
from tests.helpers import REPO, run_launch
from tests.planted import Planted
from tests.served import popen, read_output

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory)


def _prompts(path: Path, count: int = 2, new_tokens: int = 3) -> Path:
    line = json.dumps({"prompt": "the cat", "max_new_tokens": new_tokens}) + "\n"
    path.write_text(line * count)
    return path


def _generate(run: Path, prompts: Path, output: Path | str) -> int:
    from launcher.serve.command import generate_main

    return generate_main([str(run), str(prompts), "--output", str(output)])


def _answers(path: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize("as_link", [False, True], ids=["partial-file", "partial-link"])
def test_a_planted_partial_is_untouched_and_the_mode_kept(
    run: Path, tmp_path: Path, as_link: bool
) -> None:
    prompts = _prompts(tmp_path / "p.jsonl")
    out = tmp_path / "out" / "answers.jsonl"
    out.parent.mkdir()
    if not as_link:  # an existing private FILE: replaced, still private
        out.write_text("old\n")
        out.chmod(0o600)
    planted = Planted(out, tmp_path / "elsewhere", as_link)
    assert _generate(run, prompts, out) == 0
    assert _answers(out) == ["the cat", "the cat"]
    assert stat.S_IMODE(out.stat().st_mode) == (new_file_mode() if as_link else 0o600)
    planted.unchanged(out)


def test_a_link_is_written_through_to_its_file(run: Path, tmp_path: Path) -> None:
    prompts = _prompts(tmp_path / "p.jsonl")
    real = tmp_path / "results" / "real.jsonl"
    real.parent.mkdir()
    real.write_text("old\n")
    real.chmod(0o640)
    link = tmp_path / "answers.jsonl"
    link.symlink_to(real)
    assert _generate(run, prompts, link) == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert _answers(real) == ["the cat", "the cat"] and stat.S_IMODE(real.stat().st_mode) == 0o640
    assert [p.name for p in real.parent.iterdir()] == ["real.jsonl"]


def test_what_cannot_be_written_is_one_line_before_the_model_loads(
    run: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import launcher.serve.load

    loads: list[str] = []
    real_load = launcher.serve.load.load_run
    monkeypatch.setattr(
        launcher.serve.load, "load_run", lambda *a, **k: loads.append("load") or real_load(*a, **k)
    )
    prompts = _prompts(tmp_path / "p.jsonl")
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "nowhere" / "x.jsonl")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = {
        dangling: f"which does not exist. Fix: give another path, or remove the link first: rm "
        f"{dangling}",
        tmp_path: "is a directory",
        tmp_path / "new" / "o.jsonl": f"does not exist. Fix: mkdir -p {tmp_path / 'new'}",
        a_file / "o.jsonl": "Not a directory",
    }
    before = sorted(tmp_path.iterdir())
    capfd.readouterr()
    for output, words in cases.items():
        assert _generate(run, prompts, output) == 2, output
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (output, err)
    assert loads == [] and sorted(tmp_path.iterdir()) == before
    # The real command: exit 2, one line, no traceback.
    proc = run_launch(["generate", str(run), str(prompts), "--output", str(dangling)], check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "does not exist" in proc.stderr


def test_a_kill_mid_write_leaves_the_old_file_intact(run: Path, tmp_path: Path) -> None:
    prompts = _prompts(tmp_path / "p.jsonl", count=4000, new_tokens=16)  # far longer than needed
    out = tmp_path / "answers.jsonl"
    out.write_text("old\n")
    planted = Planted(out, tmp_path / "elsewhere", as_link=True)
    args = ["generate", str(run), str(prompts), "--output", str(out), "serve.slots=1"]
    # stderr to a file (outside tmp_path, which Planted watches), not a pipe: the launch can be
    # forked (tests/served.py).
    with tempfile.TemporaryFile() as err:
        proc = popen(args, REPO, dict(os.environ), stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 240
            while not [p for p in tmp_path.iterdir() if TEMP_INFIX in p.name]:
                assert proc.poll() is None, read_output(err)
                assert time.monotonic() < deadline
                time.sleep(0.02)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(60)
    assert proc.returncode == -signal.SIGKILL
    assert out.read_text() == "old\n"
    [left] = [p for p in tmp_path.iterdir() if TEMP_INFIX in p.name]
    assert left.name.startswith(".answers.jsonl.partial-")
    planted.unchanged(left)


def test_stdout_full_or_closed_is_one_line_not_a_traceback(run: Path, tmp_path: Path) -> None:
    """Without --output: a full disk behind `>` (here /dev/full) and a reader that went away
    (`| head -1`) were tracebacks (OSError, BrokenPipeError)."""
    prompts = _prompts(tmp_path / "p.jsonl")
    args = ["generate", str(run), str(prompts)]
    # stderr to a file, the closed reader a pipe of our own: the launches can be forked
    # (tests/served.py refuses a stream asked for as subprocess.PIPE).
    with open("/dev/full", "wb") as full, tempfile.TemporaryFile() as err:
        proc = popen(args, REPO, dict(os.environ), stdout=full, stderr=err)
        code = proc.wait(240)
        stderr = read_output(err)
    assert code == 2 and "Traceback" not in stderr, stderr
    assert "error: stdout: cannot write the output to stdout (No space left" in stderr
    reader, writer = os.pipe()
    os.close(reader)  # before the first line is written
    try:
        with tempfile.TemporaryFile() as err:
            closed = popen(args, REPO, dict(os.environ), stdout=writer, stderr=err)
            code = closed.wait(240)
            stderr = read_output(err)
    finally:
        os.close(writer)
    assert code == 1 and "Traceback" not in stderr and "Exception" not in stderr, stderr
    assert "error: stdout was closed before every line was written." in stderr
