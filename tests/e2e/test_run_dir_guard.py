"""A refused command leaves an existing run's Hydra record as it was; an unusable run directory
is one `error:` line (found by the new-user probe: `.hydra/` rewritten by a refused `launch plan`,
and a raw FileExistsError for a run directory that is a file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_launch

pytestmark = pytest.mark.e2e


def test_a_refused_command_keeps_the_runs_hydra_record(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_launch(["plan", "train.steps=3"], run_dir)
    record = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "train.steps=3" in record
    (run_dir / "checkpoints").mkdir()  # the run has started: a new plan is refused
    proc = run_launch(["plan", "train.steps=7", "model=small"], run_dir, check=False)
    assert proc.returncode == 2 and "holds a run that has started" in proc.stderr + proc.stdout
    assert (run_dir / ".hydra" / "overrides.yaml").read_text() == record


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda tmp: (tmp / "afile").touch() or tmp / "afile", "is a file, not a directory"),
        (lambda tmp: (tmp / "afile").touch() or tmp / "afile" / "sub", "cannot be created"),
    ],
)
def test_an_unusable_run_directory_is_one_error_line(tmp_path: Path, make, words: str) -> None:
    run_dir = make(tmp_path)
    proc = run_launch(["plan"], run_dir, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and words in output and "hydra.run.dir" in output
    assert "Traceback" not in output
