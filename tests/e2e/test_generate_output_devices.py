"""`launch generate --output` on something that is not a regular file (issue 23, item 1): a FIFO
and a character device are written in place and are still what they were afterwards; renaming
FILE.partial over them would have replaced the node with a regular file (as root, /dev/null)."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from tests.e2e.serve_run import shared_run
from tests.helpers import LAUNCH, REPO

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory)


def test_fifo_and_character_device_are_written_in_place(run: Path, tmp_path: Path) -> None:
    from launcher.serve.command import generate_main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "the cat", "max_new_tokens": 3}) + "\n")

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    assert generate_main([str(run), str(prompts), "--output", str(fifo)]) == 0
    reader.join(timeout=60)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert json.loads(received[0])["prompt"] == "the cat"

    null = tmp_path / "null"
    device = os.makedev(1, 3)  # /dev/null's numbers
    os.mknod(null, 0o666 | stat.S_IFCHR, device)
    assert generate_main([str(run), str(prompts), "--output", str(null)]) == 0
    assert stat.S_ISCHR(null.stat().st_mode) and null.stat().st_rdev == device
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "null", "p.jsonl"]


def test_dev_stdout_redirected_to_a_file_is_written_in_place(run: Path, tmp_path: Path) -> None:
    """`--output /dev/stdout` inside `{ ...; } > out.txt`: /dev/stdout leads to out.txt, which the
    shell holds open; renaming a new file over it would lose what the shell writes around it."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "the cat", "max_new_tokens": 3}) + "\n")
    out = tmp_path / "out.txt"
    launch = " ".join(shlex.quote(a) for a in [*LAUNCH, "generate", str(run), str(prompts)])
    script = f"{{ echo before; {launch} --output /dev/stdout; echo after $?; }} > {out}"
    subprocess.run(["bash", "-c", script], cwd=REPO, check=True, timeout=300)
    lines = out.read_text().splitlines()
    assert lines[0] == "before" and lines[-1] == "after 0", lines
    assert [json.loads(x)["prompt"] for x in lines[1:-1]] == ["the cat"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "p.jsonl"]


def test_inputs_that_once_raised_are_exit_2_naming_the_line(
    run: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from launcher.serve.command import generate_main

    good = '{"prompt": "the cat"}\n'
    cases = {
        "surrogate": (good + '{"prompt": "ab\\ud800|"}\n', "line 2 holds a lone surrogate"),
        "deep": (good * 2 + "[" * 100_000 + "]" * 100_000 + "\n", "line 3 nests too deep"),
    }
    capfd.readouterr()
    for name, (text, words) in cases.items():
        prompts = tmp_path / f"{name}.jsonl"
        prompts.write_text(text)
        assert generate_main([str(run), str(prompts)]) == 2, name
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (name, err)


def test_a_descriptor_that_is_not_open_is_one_error(
    run: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from launcher.serve.command import generate_main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "the cat"}) + "\n")
    capfd.readouterr()
    assert generate_main([str(run), str(prompts), "--output", "/dev/fd/987"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "descriptor 987, which is not open" in err[0], err
