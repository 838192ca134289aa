"""`launch train --help` and `launch plan --help`: every config group with its options, every key
with its value and its one-line documentation (from the dataclass fields), the flags and the exit
statuses. Hydra's own help stays behind `--hydra-help`."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from launcher import exit_codes
from launcher.config.schema import Key, class_doc, schema_keys, sections
from launcher.config.searchpath import SEARCHPATH_KEY, merged_group_options, searchpath_override

SUMMARY = {
    "train": "run a training job: in-process (dp=1), torchrun (one node) or sbatch (SLURM).",
    "plan": "resolve and validate the config, print the plan, write config.yaml and plan.json; "
    "run nothing.",
}

OPTIONAL_GROUPS = {
    "experiment": "+experiment=NAME: a ready-made run; add -m for its sweep",
    "sweep": "+sweep=NAME with -m: the axes of a sweep",
}

FLAGS = """\
flags (Hydra's):
  -m, --multirun          sweep: one job per combination of comma-separated values
  --cfg job|hydra|all     print the composed config and exit (--resolve to resolve ${...})
  -p, --package PKG       with --cfg: only this part of the config
  -cd, --config-dir DIR   add a config directory (your own groups and options)
  --info                  Hydra's view of the config search path and defaults
  --hydra-help            Hydra's own help
"""

_EXIT_FALLBACK = {"OK": "Done.", "FAILED": "The job failed (a rank's error names the cause)."}


def exit_statuses() -> list[tuple[int, str]]:
    """(status, meaning) for each constant in launcher/exit_codes.py, documented under it."""
    tree = ast.parse(inspect.getsource(exit_codes))
    found: list[tuple[int, str]] = []
    body = tree.body
    for i, stmt in enumerate(body):
        if not (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, int)
        ):
            continue
        name = stmt.targets[0].id
        doc = ""
        after = body[i + 1] if i + 1 < len(body) else None
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            doc = " ".join(after.value.value.split())
        found.append((stmt.value.value, doc or _EXIT_FALLBACK.get(name, name.lower())))
    return sorted(found)


def _shown(value: Any) -> str:
    if isinstance(value, Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value else "''"
    return str(value)


def _doc(key: Key) -> str:
    """The key's documentation, with an enum's choices when it does not name them all."""
    doc = key.doc
    if isinstance(key.type, type) and issubclass(key.type, Enum):
        names = [str(m.value) for m in key.type]
        if not all(n in doc for n in names):
            doc = f"{doc} ({' | '.join(names)})".strip()
    return doc


def _composed(
    conf_dir: Path, overrides: list[str], user_dirs: list[Path]
) -> tuple[Any, dict[str, str]]:
    """The composed config and group choices for these overrides (None, {} when they fail)."""
    if user_dirs:  # the user's config directories on the search path, as `launch train` has them
        overrides = [o for o in overrides if not o.lstrip("+").startswith(SEARCHPATH_KEY)]
        overrides.append(searchpath_override(user_dirs))
    try:
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
        choices = {str(k): str(v) for k, v in cfg.hydra.runtime.choices.items()}
        return OmegaConf.to_container(cfg, resolve=False), choices
    except Exception:  # help must print whatever the overrides hold
        return None, {}


def _lookup(tree: Any, dotted: str) -> tuple[bool, Any]:
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def render_help(
    command: str,
    conf_dir: Path,
    overrides: list[str] | None = None,
    user_dirs: Sequence[Path] = (),
) -> str:
    """The help text; values are those of the config composed with `overrides`; the groups are
    conf_dir's and those of the user's config directories."""
    dirs = list(user_dirs)
    composed, choices = _composed(conf_dir, [o for o in overrides or [] if "=" in o], dirs)
    lines = [
        f"launch {command} [key=value ...] [group=option ...] [-m] [--cfg job] [--help]",
        "",
        f"launch {command}: {SUMMARY.get(command, '')}",
        "",
        "config groups (group=option; * the default):",
    ]
    groups = merged_group_options(conf_dir, dirs)
    width = max((len(g) for g in groups), default=8) + 2
    for group, options in groups.items():
        chosen = choices.get(group)
        shown = ", ".join(f"*{o}" if o == chosen else o for o in options)
        note = f"   ({OPTIONAL_GROUPS[group]})" if group in OPTIONAL_GROUPS else ""
        lines.append(f"  {group:<{width}}{shown}{note}")
    lines += ["", "config keys (key=value; the current value after '='):"]
    keys = schema_keys()
    entries = []
    for key in keys.values():
        found, value = _lookup(composed, key.name) if composed is not None else (False, None)
        entries.append((f"{key.name}={_shown(value if found else key.default)}", _doc(key)))
    width = min(max(len(e[0]) for e in entries) + 2, 40)
    section = ""
    for (left, doc), key in zip(entries, keys.values(), strict=True):
        top = key.name.split(".", 1)[0]
        if top != section:
            section = top
            cls = sections().get(top)
            about = class_doc(cls) if cls is not None else ""
            lines.append(f" {top}: {about}" if about else f" {top}:")
        if len(left) + 2 > width:
            lines.append(f"  {left}")
            lines.append(f"  {'':<{width}}{doc}")
        else:
            lines.append(f"  {left:<{width}}{doc}")
    lines += ["", FLAGS.rstrip(), "", "exit status:"]
    lines += [f"  {code:<4}{meaning}" for code, meaning in exit_statuses()]
    lines += [
        "",
        "examples:",
        f"  launch {command} parallel.dp=2 batch.global_size=32 batch.grad_accum=4",
        f"  launch {command} model=small ac=full engine=deepspeed engine.zero_stage=2",
        f"  launch {command} -m batch.global_size=16 batch.grad_accum=1,2,4",
    ]
    return "\n".join(lines) + "\n"
