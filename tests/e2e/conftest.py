"""Trained runs shared by the e2e tests that only read them (one training per session, not one
per file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import TRAINED, run_launch
from tests.once import built_once


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run that generate, serve and their tests read (never write: copy it first)."""
    return built_once(tmp_path_factory, "trained-run", lambda path: run_launch(TRAINED, path))
