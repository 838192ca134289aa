"""The user's own config directories: `--config-dir DIR` (Hydra's `-cd`) and the entries of
`hydra.searchpath=[file://DIR,pkg://my_project.conf]` on the command line.

Their groups extend the launcher's: `launch train --config-dir my_conf model=my_net` finds
my_conf/model/my_net.yaml next to the built-in conf/model/{tiny,small,gpt2}.yaml. Hydra searches
the launcher's conf/ first, so a user's file with a built-in name (model/tiny.yaml) is not the one
used; give it a name of its own. The up-front override check (overrides.py) lists the options of
these directories too, so `model=my_nett` is still refused with `model=my_net` suggested.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from launcher.config.schema import group_options
from launcher.errors import ConfigError
from launcher.user_code import importable_from_cwd

SEARCHPATH_KEY = "hydra.searchpath"


@dataclass
class UserConfigs:
    """The user's config directories found on the command line."""

    dirs: list[Path] = field(default_factory=list)
    """Directories whose groups and options extend conf/'s."""
    complete: bool = True
    """False when some source cannot be listed (a pkg:// entry that does not import, or
    --config-path/--config-name, which replace the launcher's primary config): the groups and
    options are then left to Hydra to check."""

    @property
    def any(self) -> bool:
        return bool(self.dirs) or not self.complete


def _searchpath_entries(overrides: list[str]) -> list[str]:
    """The entries of a `hydra.searchpath=[...]` override (the last one wins, as in Hydra)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    entries: list[str] = []
    for text in overrides:
        if not text.lstrip("+").startswith(SEARCHPATH_KEY):
            continue
        try:
            override = parser.parse_override(text)
        except HydraException:
            continue  # the override check reports it
        if override.get_key_element().lstrip("+") != SEARCHPATH_KEY:
            continue
        value = override.value()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(
                SEARCHPATH_KEY,
                f"must be a list of config locations, got {value!r}.",
                "write 'hydra.searchpath=[file:///abs/my_conf,pkg://my_project.conf]' "
                "(quoted for the shell), or use --config-dir my_conf.",
            )
        entries = list(value)
    return entries


def _package_dir(package: str) -> Path | None:
    """The directory of an importable package (from the working directory or PYTHONPATH)."""
    importable_from_cwd()  # as for a user's `_target_`: `launch` lacks the cwd
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        if Path(location).is_dir():
            return Path(location)
    return None


def user_configs(
    config_dir: str | None,
    overrides: list[str],
    config_path: str | None = None,
    config_name: str | None = None,
) -> UserConfigs:
    """The user's config directories, checked to exist (else one ConfigError naming the flag)."""
    found = UserConfigs(complete=config_path is None and config_name is None)
    if config_dir is not None:
        path = Path(config_dir).expanduser().absolute()
        if not path.is_dir():
            raise ConfigError(
                "--config-dir",
                f"{path} is not a directory.",
                "give your config directory (the one holding model/, data/, ...), e.g. "
                "--config-dir conf from your project's root.",
            )
        found.dirs.append(path)
    for entry in _searchpath_entries(overrides):
        scheme, sep, rest = entry.partition("://")
        if not sep:
            scheme, rest = "file", entry
        located = Path(rest).expanduser().absolute() if scheme == "file" else None
        if scheme == "pkg":
            located = _package_dir(rest)
        if located is not None and located.is_dir():
            found.dirs.append(located)
        elif scheme == "file":
            raise ConfigError(
                SEARCHPATH_KEY,
                f"{entry!r}: {located} is not a directory.",
                "give an existing config directory, e.g. 'hydra.searchpath=[file://my_conf]'.",
            )
        else:
            found.complete = False  # pkg:// that does not import here, or another scheme
    return found


def merged_group_options(conf_dir: Path, dirs: list[Path]) -> dict[str, list[str]]:
    """{group: options} of the launcher's conf_dir and the user's directories together."""
    merged: dict[str, set[str]] = {}
    for directory in [conf_dir, *dirs]:
        for group, options in group_options(directory).items():
            merged.setdefault(group, set()).update(options)
    return {group: sorted(options) for group, options in sorted(merged.items())}


def searchpath_override(dirs: list[Path]) -> str:
    """The `hydra.searchpath` override that puts `dirs` on Hydra's search path (for compose)."""
    return f"{SEARCHPATH_KEY}=[{','.join(f'file://{d}' for d in dirs)}]"
