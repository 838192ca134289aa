"""A disk cache of activation probes, so that launching the same model again does not pay the
fake-tensor probe (about 2 s the first time in a process: torch sets up its fake-tensor machinery).

An entry is keyed by everything the probe's answer depends on: the model section, the recompute
policy, precision and engine cast, the versions of torch and the launcher, and the source of the
code that runs (the probe, the recompute policies, the built-in GPT or the module of a user's
`_target_`, and the files a model's arguments name, such as a transformers config.json). The
cache lives in $LAUNCHER_CACHE_DIR, else $XDG_CACHE_HOME/launcher, else ~/.cache/launcher; a
directory that cannot be written, or a damaged entry, only means the probe runs again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

import launcher
from launcher.config.model import UserModelConfig
from launcher.config.root import RootConfig
from launcher.host import cache_dir

_OWN_CODE = (
    "memory/probe.py",
    "recompute/policies.py",
    "recompute/segments.py",
    "recompute/selective.py",
    "recompute/wrap.py",
    "models/gpt.py",
)


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def _module_file(target: str) -> Path | None:
    """The source file of the module that defines a `_target_` (without importing it)."""
    module = target.rsplit(".", 1)[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def _named_files(kwargs: dict[str, Any]) -> dict[str, str]:
    """Digests of the files a model's arguments name (a directory: its config.json)."""
    found: dict[str, str] = {}
    for key, value in sorted(kwargs.items()):
        if not isinstance(value, str) or not value:
            continue
        path = Path(value)
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            found[key] = _file_digest(path)
    return found


def probe_key(cfg: RootConfig, policy: str, cast: bool) -> str:
    """The cache key of one policy's probe for this run's model."""
    package = Path(launcher.__file__).parent
    code = {name: _file_digest(package / name) for name in _OWN_CODE}
    model = cfg.model
    if isinstance(model, UserModelConfig):
        source = _module_file(model._target_)
        code["model"] = _file_digest(source) if source is not None else "unknown"
        code.update(_named_files(model.kwargs))
        section: Any = model.plain()
    else:
        section = dataclasses.asdict(model)
    # The installed version from its metadata: importing transformers costs a second or two at
    # every launch, even for runs that never use it.
    try:
        versions = {"transformers": importlib.metadata.version("transformers")}
    except importlib.metadata.PackageNotFoundError:
        versions = {}
    identity = {
        "model": section,
        "policy": policy,
        "every_n": cfg.ac.every_n,
        "precision": cfg.train.precision.value,
        "cast": cast,
        "torch": torch.__version__,
        "launcher": launcher.__version__,
        "code": code,
        **versions,
    }
    if cfg.adapter.enabled:  # the adapters' own activations (keys of other runs unchanged)
        identity["adapter"] = cfg.adapter.fingerprint()
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(key: str) -> dict[str, Any] | None:
    try:
        data = json.loads((cache_dir() / "probes" / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def store(key: str, value: dict[str, Any]) -> None:
    """Write atomically (concurrent launches may store the same entry); failures are ignored."""
    folder = cache_dir() / "probes"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(value, out)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass
