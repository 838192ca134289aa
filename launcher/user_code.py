"""The user's own code named by a dotted path (`model._target_`, `data._target_`, a `pkg://`
config package): importable from the directory `launch` runs in, and from PYTHONPATH.

`launch` is a console script, so its sys.path lacks the working directory that `python -m`
would add; the ranks torchrun starts (`python -m launcher.worker`) have it. Both look in the
same place once the working directory is put first here.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from launcher.errors import ConfigError


def importable_from_cwd() -> str:
    """Put the working directory on the import path (first, as `python -m` does); return it."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    return cwd


def import_fix(path: str, what: str) -> str:
    """The fix for a dotted path that does not import: where its top-level package must be."""
    top = path.split(".", 1)[0] or path
    return (
        f"run launch from the directory that holds {top}/ (now {os.getcwd()}: the working "
        f"directory is on the import path), add that directory to PYTHONPATH, or pip install "
        f"your package; {what} is the dotted path of a class or function (package.module.Name)."
    )


def locate(path: str, key: str) -> Any:
    """The class or function `path` names, or one ConfigError naming `key` and where to run."""
    from hydra.utils import get_object

    importable_from_cwd()
    hydra_log = logging.getLogger("hydra.utils")
    was = hydra_log.disabled
    hydra_log.disabled = True  # it logs its own three lines before raising; ours says it once
    try:
        return get_object(path)
    except Exception as exc:  # ImportError, AttributeError, ValueError: all "does not import"
        cause = exc.__cause__ or exc
        first = str(cause).splitlines()[0] if str(cause) else ""
        raise ConfigError(
            key,
            f"{path!r} does not import ({type(cause).__name__}: {first}).",
            import_fix(path, key),
        ) from None
    finally:
        hydra_log.disabled = was
