"""benchmarks/gpu_check.py on a machine without CUDA: it says so and exits 0 (issue 24)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from tests.helpers import REPO


def test_without_cuda_it_says_so_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--json", str(out)],
        cwd=REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "found no CUDA device" in proc.stdout
    assert json.loads(out.read_text()) == {"cuda_devices": [], "rows": []}


def test_an_unknown_section_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:  # before looking for devices
        gpu_check.main(["--sections", "mfu,speed"])
    assert exited.value.code == 2
    assert "unknown section(s) ['speed']" in capsys.readouterr().err
