"""Checkpoint directories on disk: layout, atomic commit, discovery, and which one to resume.

    <run dir>/checkpoints/step_<N>/
        engine/            the engine's state: DCP shards (ddp, fsdp) or the engine's own format
        rng/rank_<r>.pt    each rank's torch, CUDA, numpy and python RNG states
        meta.json          step, run totals, config fingerprint, engine, world size, and the
                           size and digest of every data source (launcher/integrity/data.py)
        complete.json      written last: every file, its size and SHA-256 (the completion marker)

A save goes into checkpoints/.tmp_step_<N>, gets its marker, and is then renamed into place, so
a step_<N> directory is complete by construction. A directory whose marker is missing, or whose
files no longer have the sizes the marker lists (a truncated copy, a full disk), is skipped with
a warning naming it; so is one whose files no longer match their digests (a damaged disk, an
overwrite), found when it is about to be loaded. When every step_<N> directory is damaged,
resuming is refused rather than silently starting over them. Nothing here needs a process
group: `launch` uses it before starting ranks.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.checkpoint.retention import past_keep
from launcher.config.root import RootConfig
from launcher.errors import ConfigError
from launcher.integrity.digests import file_digest
from launcher.logs import get_logger
from launcher.rundir import CHECKPOINTS_DIR
from launcher.userpath import open_own

log = get_logger("checkpoint")

STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp_step_"
OLD_PREFIX = ".old_step_"
MARKER = "complete.json"
META = "meta.json"
ENGINE_DIR = "engine"
RNG_DIR = "rng"


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / CHECKPOINTS_DIR


# --- finding complete checkpoints ----------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    meta: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def order(self) -> tuple[float, int]:
        # The newest is the last saved: after resuming from an older checkpoint by path, its
        # successors are saved later than the abandoned ones with higher step numbers.
        return float(self.meta.get("saved_at", 0.0)), self.step


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def inspect(path: Path, verify: bool = True) -> Checkpoint | str:
    """The checkpoint at `path`, or why it is not a complete one; verify: also every file's
    digest (it reads the whole checkpoint)."""
    if not path.is_dir():
        return "not a directory"
    try:
        manifest = _read_json(path / MARKER)
    except FileNotFoundError:
        return f"incomplete: no {MARKER} (its save was interrupted)"
    except (OSError, ValueError):
        return f"its {MARKER} is unreadable"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or META not in files:
        return f"its {MARKER} lists no files"
    for rel, size in files.items():
        file = path / rel
        if not file.is_file():
            return f"{rel} is missing"
        actual = file.stat().st_size
        if actual != size:
            return f"{rel} has {actual} bytes, but {size} were written (truncated or damaged)"
    # meta.json is read to judge the checkpoint (its config, its data) before the large files'
    # digests are checked at load: its own digest (a small file) is checked always.
    problem = damaged_file(path, manifest, only=None if verify else META)
    if problem:
        return problem
    try:
        meta = _read_json(path / META)
        int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {META} is unreadable"
    return Checkpoint(path, meta)


def damaged_file(path: Path, manifest: Any = None, only: str | None = None) -> str | None:
    """Why a checkpoint's files (or the one file `only`) are not those its save wrote (a digest
    differs), or None. Checkpoints written before digests were recorded are judged by their
    sizes alone."""
    if manifest is None:
        try:
            manifest = _read_json(path / MARKER)
        except (OSError, ValueError):
            return f"its {MARKER} is unreadable"
    digests = manifest.get("sha256") if isinstance(manifest, dict) else None
    for rel, digest in (digests or {}).items():
        if only is not None and rel != only:
            continue
        try:
            actual = file_digest(path / rel)
        except OSError as exc:
            return f"{rel} cannot be read ({exc.strerror})"
        if actual != digest:
            return f"{rel} does not match the digest written at save (damaged)"
    return None


def scan_checkpoints(
    run_dir: Path, *, warn: bool = True, verify: bool = False
) -> tuple[list[Checkpoint], list[tuple[Path, str]]]:
    """Complete checkpoints of a run directory, newest first, and the damaged step_<N>
    directories with why; warn about each one skipped. verify: check digests from the newest
    down to the first intact one (the one a caller loads; older ones are checked when
    reached)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return [], []
    found: list[Checkpoint] = []
    damaged: list[tuple[Path, str]] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(TMP_PREFIX):
            if warn:
                log.warning(f"skipping {entry}: an interrupted save (incomplete).")
            continue
        if not entry.name.startswith(STEP_PREFIX):
            continue
        result = inspect(entry, verify=False)
        if isinstance(result, str):
            if warn:
                log.warning(f"skipping checkpoint {entry}: {result}.")
            damaged.append((entry, result))
            continue
        found.append(result)
    found.sort(key=lambda c: c.order, reverse=True)
    while verify and found:
        problem = damaged_file(found[0].path)
        if problem is None:
            break
        if warn:
            log.warning(f"skipping checkpoint {found[0].path}: {problem}.")
        damaged.append((found.pop(0).path, problem))
    return found, damaged


def find_checkpoints(run_dir: Path, *, warn: bool = True, verify: bool = True) -> list[Checkpoint]:
    """Complete checkpoints of a run directory, newest first, the first one's digests verified;
    warn about each one skipped."""
    return scan_checkpoints(run_dir, warn=warn, verify=verify)[0]


def none_loads(run_dir: Path, failed: list[tuple[Path, str]]) -> ConfigError:
    """The refusal when checkpoints exist and none of them can be resumed: starting from step 1
    would append a second history to metrics.jsonl and overwrite the damaged files."""
    names = "; ".join(f"{path.name} ({why})" for path, why in failed)
    return ConfigError(
        "train.resume",
        f"{run_dir} holds checkpoints, but none can be resumed: {names}. Nothing was trained "
        "and nothing was overwritten.",
        "restore them from a copy, or pass an intact one as train.resume=PATH; to start over "
        "deliberately, add train.resume=never checkpoint.overwrite=true (it deletes them), or "
        "choose another hydra.run.dir.",
    )


def resume_candidates(
    cfg: RootConfig, run_dir: Path, *, restarted: bool, warn: bool
) -> list[Checkpoint]:
    """The checkpoints to try, in order (empty: start fresh).

    train.resume=auto: every complete one, newest first. A PATH: that one. never: none. A rank
    restarted by torchrun always takes the newest in the run directory, when there is one.
    When the run directory holds step_<N> directories and none is complete, refuse (ConfigError):
    a silent fresh start would overwrite them.
    """
    mode = cfg.train.resume
    if restarted or mode == "auto":
        found, damaged = scan_checkpoints(run_dir, warn=warn)
        if not found and damaged:
            raise none_loads(run_dir, damaged)
        if found or mode == "auto":
            return found
    if mode == "never":
        return []
    path = Path(mode).expanduser()
    result = inspect(path, verify=False)  # the digests: where it is loaded (Checkpointer._load)
    if isinstance(result, str):
        raise ConfigError(
            "train.resume",
            f"{path} is not a usable checkpoint: {result}.",
            "pass a complete checkpoints/step_<N> directory, or train.resume=auto for the newest.",
        )
    return [result]


# --- files ---------------------------------------------------------------------------------------


def write_synced(path: Path, text: str) -> None:
    """A new file of the save, never through a link (O_NOFOLLOW: a link there is refused)."""
    with open(open_own(path, flags=os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def manifest(directory: Path) -> dict[str, Any]:
    """The completion record: every file's size and SHA-256."""
    files = [p for p in sorted(directory.rglob("*")) if p.is_file()]
    return {
        "files": {str(p.relative_to(directory)): p.stat().st_size for p in files},
        "sha256": {str(p.relative_to(directory)): file_digest(p) for p in files},
    }


def commit(tmp: Path, final: Path) -> None:
    """Rename a complete save into place (replacing an older save of the same step)."""
    if final.exists():
        old = final.with_name(OLD_PREFIX + final.name.removeprefix(STEP_PREFIX))
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    _sync_dir(final.parent)


def prune(run_dir: Path, keep: int, current: Path) -> None:
    """Keep the newest `keep` complete checkpoints (and, within a bound, those an evaluation has
    not read yet: launcher/checkpoint/retention.py); remove leftovers of interrupted saves."""
    root = checkpoints_dir(run_dir)
    for entry in root.iterdir():
        if entry.name.startswith((TMP_PREFIX, OLD_PREFIX)):
            shutil.rmtree(entry, ignore_errors=True)
    stale = find_checkpoints(run_dir, warn=False, verify=False)[keep:]
    for path in past_keep(run_dir, [(c.step, c.path) for c in stale if c.path != current], keep):
        shutil.rmtree(path, ignore_errors=True)
