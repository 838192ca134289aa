"""Where the launcher's own files are: the Hydra config groups (conf/) and the sbatch template
(slurm/train.sbatch).

In the repository they are the top-level conf/ and slurm/ directories; the wheel ships them as
the data-only packages `launcher.conf` and `launcher.slurm` (mapped in pyproject.toml and
setup.py). They are found through the import system, so a plain `pip install`, an editable
install and a checkout all work. `find_spec` locates the directory without importing anything.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def _package_dir(name: str, checkout_dir: str) -> Path:
    """The directory of the data package `name`, else the checkout's `checkout_dir` (an editable
    install made before the mapping existed imports launcher/ from the checkout)."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        if Path(location).is_dir():
            return Path(location).resolve()
    return _CHECKOUT / checkout_dir


@cache
def conf_dir() -> Path:
    """The launcher's config directory (config.yaml and the groups model/, data/, engine/, ...)."""
    return _package_dir("launcher.conf", "conf")


@cache
def sbatch_template() -> Path:
    """The template that cluster=slurm renders into each run's train.sbatch."""
    return _package_dir("launcher.slurm", "slurm") / "train.sbatch"
