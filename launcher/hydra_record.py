"""An explicit `hydra.run.dir` checked before Hydra touches it, an existing run's Hydra record
(`.hydra/`) kept when the launcher refuses the command, and one composition of the config per
command instead of Hydra's two.

Hydra writes `.hydra/config.yaml` and `overrides.yaml` into the run directory before the launcher
can validate anything (or find the directory locked by a running run). A refused command must
leave the directory as it found it, so the record is copied aside first and put back on refusal.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from launcher.errors import ConfigError
from launcher.exit_codes import CONFIG_ERROR
from launcher.rundir import HYDRA_DIR

_KEY = "hydra.run.dir"


def explicit_run_dir(overrides: list[str]) -> Path | None:
    """The directory a `hydra.run.dir=...` override names (the last one wins), else None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    found: Path | None = None
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.key_or_group == _KEY and not override.is_delete():
            value = override.value()
            if isinstance(value, str) and value.strip():
                found = Path(value).expanduser()
    return found


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run directory that is a file or cannot be created, before Hydra tries."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(
            _KEY, f"{run_dir} is a file, not a directory.", f"pick a directory ({_KEY}=...)."
        )
    existing = next((p for p in (run_dir, *run_dir.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise ConfigError(
            _KEY,
            f"{run_dir} cannot be created: {existing} is not a directory.",
            f"pick another {_KEY}.",
        )
    try:
        probe = Path(tempfile.mkdtemp(prefix=".launch-probe-", dir=existing))
    except OSError as exc:
        raise ConfigError(
            _KEY,
            f"{run_dir} cannot be created in {existing}: {exc.strerror or exc}.",
            f"pick a writable {_KEY}.",
        ) from None
    probe.rmdir()


@contextmanager
def keep_record_on_refusal(run_dir: Path | None) -> Iterator[None]:
    """Around Hydra's job: if it exits with CONFIG_ERROR, restore `<run_dir>/.hydra` as it was."""
    record = run_dir / HYDRA_DIR if run_dir is not None else None
    if record is None or not record.is_dir():
        yield
        return
    backup = Path(tempfile.mkdtemp(prefix="launch-hydra-record-"))
    try:
        shutil.copytree(record, backup / HYDRA_DIR)
        try:
            yield
        except SystemExit as exc:
            if exc.code == CONFIG_ERROR:
                shutil.rmtree(record, ignore_errors=True)
                shutil.copytree(backup / HYDRA_DIR, record)
            raise
    finally:
        shutil.rmtree(backup, ignore_errors=True)


MODE_KEYS = ("hydra.mode", "hydra/")
"""Overrides that may set hydra.mode: the key itself, or one of Hydra's own config groups."""


def sets_mode(overrides: list[str]) -> bool:
    """Whether an override may set hydra.mode (Hydra's whole section, the key, a hydra/ group)."""
    keys = [text.lstrip("+~").partition("=")[0].strip() for text in overrides]
    return any(key == "hydra" or key.startswith(MODE_KEYS) for key in keys)


@contextmanager
def one_compose(mode_known: bool) -> Iterator[None]:
    """Hydra composes the whole config once only to read `hydra.mode`, then again for the job
    (each about 0.2 s). When nothing can set hydra.mode (mode_known: no config directory of the
    user's, no override of it, and conf/ sets it nowhere, which tests/unit/test_startup_imports.py
    checks), that first answer is known: None, the mode then being the command line's (-m or
    not). Inside this context Hydra gives it without composing."""
    if not mode_known:
        yield
        return
    from hydra._internal.hydra import Hydra

    read_mode = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Hydra.get_mode = read_mode  # type: ignore[method-assign]
