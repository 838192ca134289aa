"""The config's keys as data: every dotted key of the typed schema with its type, default and
one-line documentation, and the config groups under conf/ with their options.

The documentation is the string literal written under each dataclass field (the convention in
launcher/config/*.py), read from the source with `ast`, so a key is documented in one place.
`launch train --help` lists these, and a mistyped key on the command line is matched against them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config.keywords import key_name
from launcher.config.model import ModelConfig, UserModelConfig
from launcher.config.root import RootConfig

MODEL_SCHEMAS: tuple[type, ...] = (ModelConfig, UserModelConfig)
"""The model section's schemas (RootConfig types it openly): the built-in GPT's shape first."""


@dataclass(frozen=True)
class Key:
    """One settable leaf of the schema, e.g. `batch.grad_accum`."""

    name: str
    """The dotted key, as typed on the command line."""
    type: Any
    """The field's type without Optional: int, float, bool, str, an Enum, list[...], dict[...]."""
    optional: bool
    """null is allowed."""
    default: Any
    """The schema's default (a group's YAML file may set another)."""
    doc: str
    """The field's documentation, on one line ("" when it has none)."""


def _one_line(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split())


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: documentation} from the string literal under each field of a dataclass."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.ClassDef):
        return {}
    docs: dict[str, str] = {}
    body = node.body
    for stmt, after in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = _one_line(after.value.value)
    return docs


def class_doc(cls: type) -> str:
    """The first paragraph of a dataclass's own docstring, on one line."""
    doc = cls.__doc__ or ""
    return _one_line(doc.strip().split("\n\n")[0]) if doc else ""


def split_optional(hint: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed) for `X | None` and Optional[X]."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        if len(args) == 1:
            return args[0], optional
        return hint, optional
    return hint, False


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


@functools.cache
def sections(root: type = RootConfig) -> dict[str, type]:
    """{dotted section: its dataclass}, e.g. {"batch": BatchConfig, ...}."""
    found: dict[str, type] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp, _ = split_optional(hints[f.name])
            if cls is RootConfig and f.name == "model":
                tp = MODEL_SCHEMAS[0]
            if is_section(tp):
                found[prefix + f.name] = tp
                walk(tp, f"{prefix}{f.name}.")

    walk(root, "")
    return found


@functools.cache
def schema_keys(root: type = RootConfig) -> dict[str, Key]:
    """{dotted key: Key} for every leaf of the schema, in declaration order."""
    keys: dict[str, Key] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            tp, optional = split_optional(hints[f.name])
            name = prefix + key_name(f.name)
            if cls is RootConfig and f.name == "model":
                for schema in MODEL_SCHEMAS:
                    walk(schema, name + ".")
            elif name in keys or name == "model.kwargs":
                continue  # a model key both schemas have; a user model's arguments (flat)
            elif is_section(tp):
                walk(tp, name + ".")
            else:
                keys[name] = Key(name, tp, optional, _default(f), docs.get(f.name, ""))

    walk(root, "")
    return keys


def group_options(conf_dir: Path) -> dict[str, list[str]]:
    """{group: sorted option names} for the config groups under conf_dir (model, data, ...)."""
    if not conf_dir.is_dir():
        return {}
    return {
        group.name: sorted(p.stem for p in group.glob("*.yaml"))
        for group in sorted(conf_dir.iterdir())
        if group.is_dir() and not group.name.startswith((".", "_"))
    }


def user_model_chosen(overrides: list[str], conf_dir: Path, groups_known: bool = True) -> bool:
    """A `model=` option whose file names a `_target_` (or one from a user's config directory):
    its keys are the model's own arguments, so any `model.KEY` may be set."""
    options = [o.split("=", 1)[1] for o in overrides if o.startswith(("model=", "+model="))]
    if not options:
        return not groups_known
    path = conf_dir / "model" / f"{options[-1]}.yaml"
    if not path.is_file():
        return True
    return any(line.startswith("_target_:") for line in path.read_text().splitlines())
