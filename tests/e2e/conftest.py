"""Trained runs shared by the e2e tests that only read them (one training per session, not one
per file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import TRAINED, run_launch


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run that generate, serve and their tests read (never write: copy it first)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    run_launch(TRAINED, run_dir)
    return run_dir
