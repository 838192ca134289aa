"""Directories built once per test run and read by many tests, whichever xdist worker asks first.

A session fixture runs once per pytest-xdist worker; a trained run several modules read would be
trained once per worker. `built_once` builds it in the directory the workers share, under a file
lock: the first to ask builds, the others wait (without their core token: tests/cores.py) and
read the same files.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cores import waiting


def shared_temp(factory: pytest.TempPathFactory) -> Path:
    """The temporary directory of this whole test run: every xdist worker's base's parent."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(
    factory: pytest.TempPathFactory,
    name: str,
    build: Callable[[Path], object],
    done: str = "summary.json",
) -> Path:
    """shared_temp/name, made by build(path) unless path/done exists already (a build that
    failed half-way is removed and made again)."""
    root = shared_temp(factory)
    path = root / name
    fd = os.open(root / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with waiting():
                fcntl.flock(fd, fcntl.LOCK_EX)
        if not (path / done).exists():
            shutil.rmtree(path, ignore_errors=True)
            build(path)
    finally:
        os.close(fd)
    return path
