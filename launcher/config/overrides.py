"""The command line's overrides, checked before Hydra composes anything, and Hydra's own errors
in the launcher's words.

`launch train batch.grad_acum=2` would otherwise print Hydra's multi-line text and its advice to
add `+` (which the launcher then refuses). Here every override is checked against the typed
schema (launcher/config/schema.py) and the config groups under conf/: an unknown key, a group
option that does not exist, or a value of the wrong type is one ConfigError that names the key,
suggests the nearest known key or option, and lists the valid choices. A sweep (`-m key=a,b`) is
checked value by value, so a bad value fails before any point runs. What the checks here cannot
see (a user's own config directory, values set inside YAML files) is still checked by Hydra, and
`translate_hydra_error` turns its exception into the same one-line form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from launcher.config.schema import Key, schema_keys, sections, user_model_chosen
from launcher.config.searchpath import merged_group_options
from launcher.config.suggest import choices as _choices
from launcher.config.suggest import did_you_mean as _did_you_mean
from launcher.config.suggest import help_hint as _help
from launcher.config.suggest import one_of as _one_of
from launcher.config.suggest import suggestions as _suggestions
from launcher.config.values import check_value
from launcher.errors import ConfigError

RUN_DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir")


def unknown_key_error(
    key: str, command: str = "train", added: bool = False, groups: Iterable[str] = ()
) -> ConfigError:
    """No such key: the nearest keys, sections and groups as suggestions."""
    candidates = [*schema_keys(), *sections(), *groups]
    problem = (
        "no such key." if not added else "no such key (a key added with + is read by nothing)."
    )
    fix = _did_you_mean(_suggestions(key, candidates)) + _help(command)
    return ConfigError(key, problem, fix)


def _group_error(group: str, option: str, options: list[str], where: str = "conf/") -> ConfigError:
    near = _suggestions(option, options)
    mean = _did_you_mean([f"{group}={n}" for n in near])
    return ConfigError(
        group,
        f"no option {option!r} (no {group}/{option}.yaml in {where}).",
        _one_of(mean, options),
    )


def _under_mapping(name: str, keys: dict[str, Key]) -> bool:
    """`engine.extra.foo`: below a dict (or list) field, any name is the user's own."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        key = keys.get(".".join(parts[:i]))
        if key is not None and getattr(key.type, "__origin__", None) in (dict, list):
            return True
    return False


def check_run_dir(key: str, value: Any) -> None:
    """An empty hydra.run.dir would put the run's files in the current directory."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ConfigError(
            key,
            "is empty: the run's files would be written into the current directory.",
            f"give a directory, e.g. {key}=outputs/my-run, or leave {key} out "
            "(outputs/<date>/<time>).",
        )


def _values(override: Any, parser: Any) -> list[Any]:
    """The values an override sets: one, or each of a sweep's (none for a glob or an interval)."""
    if not override.is_sweep_override():
        return [override.value()]
    if override.value_type.name in ("GLOB_CHOICE_SWEEP", "INTERVAL_SWEEP"):
        return []
    key = override.key_or_group
    return [parser.parse_override(f"{key}={s}").value() for s in override.sweep_string_iterator()]


def check_overrides(
    overrides: list[str],
    conf_dir: Path,
    command: str = "train",
    groups_known: bool = True,
    user_dirs: Sequence[Path] = (),
) -> None:
    """Check command-line overrides against the schema and conf_dir's groups; raise ConfigError.

    user_dirs (the user's --config-dir and hydra.searchpath directories) add their groups and
    options to conf_dir's. groups_known=False (a config source that cannot be listed is in play):
    group names and options may come from elsewhere, so only schema keys are checked.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    keys = schema_keys()
    groups = merged_group_options(conf_dir, list(user_dirs))
    where = " or ".join([f"{conf_dir.name}/", *(str(d) for d in user_dirs)])
    user_model = user_model_chosen(overrides, conf_dir, groups_known)
    for text in overrides:
        try:
            override = parser.parse_override(text)
            values = _values(override, parser)
        except HydraException as exc:
            raise ConfigError(
                text,
                f"cannot be read as an override ({_first_line(str(exc))}).",
                _unreadable_fix(text),
            ) from None
        name = override.key_or_group
        if name in RUN_DIR_KEYS:
            for value in values:
                check_run_dir(name, value)
            continue
        if name == "hydra" or name.startswith(("hydra.", "hydra/")):
            continue
        if override.is_delete():
            known = name in keys or name in sections() or name in groups
            if not known and not _under_mapping(name, keys):
                raise unknown_key_error(name, command, groups=groups)
            continue
        if name in groups:
            if groups_known:
                options = groups[name]
                for value in values:
                    if isinstance(value, str) and value not in options:
                        raise _group_error(name, value, options, where)
            continue
        if name in keys:
            for value in values:
                check_value(keys[name], value)
            continue
        if name in sections() or _under_mapping(name, keys):
            continue  # a whole section as a mapping, or an entry of engine.extra: Hydra checks it
        if user_model and name.startswith("model."):
            continue  # an argument of the user's model: Hydra and the model check it
        if not groups_known and "." not in name:
            continue  # perhaps a group of the user's config directory
        raise unknown_key_error(name, command, added=override.is_add(), groups=groups)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip().rstrip(".")
    return text.strip()


_QUOTED = re.compile(r"'([^']+)'")


def translate_hydra_error(exc: BaseException, command: str = "train") -> ConfigError:
    """One ConfigError for an exception Hydra raised while composing the config."""
    text = str(exc)
    first = _first_line(text)
    quoted = _QUOTED.findall(first)
    cause = exc.__cause__
    detail = _first_line(str(cause)) if cause is not None else ""
    missing = re.search(r"Could not (?:find|load) '([^']+)'", text)
    if missing:
        path = missing.group(1)
        group = path.rpartition("/")[0]
        options = re.findall(r"^\t(\S+)$", text, flags=re.MULTILINE)
        fix = f"use one of: {_choices(options)}." if options else _help(command)
        return ConfigError(group or path, f"no config {path!r}.", fix)
    hint = re.search(r"use (\+\S+)", text)
    if first.startswith("Could not override") and quoted:
        key = quoted[0]
        if "No match in the defaults list" in text and hint:
            return ConfigError(key, "is not in the defaults list.", f"add it with {hint.group(1)}.")
        keys = schema_keys()
        if _under_mapping(key, keys) and hint:
            return ConfigError(key, "is not set yet.", f"add it with {hint.group(1)}.")
        return unknown_key_error(key, command)
    if first.startswith("Could not append to config") and quoted:
        return ConfigError(quoted[0], "is already set.", f"drop the +: {quoted[0]}=VALUE.")
    if first.startswith("Ambiguous value for argument") and quoted:
        key, _, value = quoted[0].partition("=")
        return ConfigError(
            key,
            f"several values ({value}) without -m.",
            f"add -m to run one job per value (a sweep), or write {key}=[{value}] for a list.",
        )
    if first.startswith("Error merging override") and quoted:
        key = quoted[0].split("=", 1)[0]
        return ConfigError(key, f"{detail or first}.", _help(command))
    full_key = getattr(cause, "full_key", None) or getattr(exc, "full_key", None)
    problem = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return ConfigError(str(full_key or "config"), problem or type(exc).__name__, _help(command))


def _unreadable_fix(text: str) -> str:
    """An override Hydra's grammar cannot read: a bracketed IPv6 address with a port
    ([fd00::1]:29500) reads as a broken list; as a quoted string it is read whole."""
    name, _, value = text.partition("=")
    if re.fullmatch(r"\[[0-9A-Fa-f:.%]+\]:\d+", value):
        return f"quote the value as a string, and the override for the shell: '{name}=\"{value}\"'."
    return "write name=value; for a list name=[a,b], and quote the whole override for the shell."
