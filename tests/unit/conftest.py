"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from launcher.config.store import register_configs

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def hydra_conf():
    """Hydra's compose API over the project's conf/, with the schema registered."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()
