"""tests/suite_profile.py: each test's line (wall, CPU of the processes it reaped, tokens held,
waits) and the summary `make test` prints from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cores import Cores
from tests.suite_profile import FILE_ENV, Line, recorded, summary


def test_a_test_line_counts_its_tokens_and_the_cpu_of_what_it_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "profile.jsonl"
    monkeypatch.setenv(FILE_ENV, str(target))
    (tmp_path / "tokens").mkdir()
    worker = Cores(tmp_path / "tokens", 2)
    with recorded("tests/x.py::test_spin", worker):
        worker.take(2)
        spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
        subprocess.run([sys.executable, "-c", spin], check=True)  # reaped: its CPU counts
        worker.release()
    (line,) = [Line(**json.loads(row)) for row in target.read_text().splitlines()]
    assert line.test == "tests/x.py::test_spin"
    assert line.cpu >= 0.3 and line.wall >= line.token_s / 2 > 0


def test_nothing_is_written_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(FILE_ENV, raising=False)
    with recorded("tests/x.py::test_a", Cores(tmp_path, 1)):
        pass
    assert list(tmp_path.iterdir()) == []


def test_the_summary_ranks_idle_holders_modules_and_waits() -> None:
    lines = [
        Line("tests/a.py::test_waits", "gw0", 0.0, 50.0, 1.0, 100.0, 0.0),
        Line("tests/a.py::test_works", "gw1", 0.0, 10.0, 10.0, 10.0, 30.0),
        Line("tests/b.py::test_heavy", "gw1", 10.0, 40.0, 60.0, 80.0, 0.0),
    ]
    text = summary(lines, top=1)
    assert text.startswith("3 tests over 50 s: 71 CPU-s")
    held, modules, waited = text.split("\n\n")[1:]
    assert held.splitlines()[1].split()[0] == "99" and "test_waits" in held  # 100 - 1
    assert modules.splitlines()[1].split()[0] == "60" and "tests/b.py" in modules
    assert "30  gw1  tests/a.py::test_works" in waited
