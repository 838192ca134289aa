"""The user's own config directories (--config-dir, hydra.searchpath) and the launcher's own files
(conf/, the sbatch template) wherever the package is installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.overrides import check_overrides
from launcher.config.searchpath import merged_group_options, user_configs
from launcher.errors import ConfigError
from launcher.resources import conf_dir, sbatch_template

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
EXAMPLE_CONF = REPO / "examples" / "own_project" / "conf"


def test_the_launchers_own_files_are_found() -> None:
    assert (conf_dir() / "config.yaml").is_file() and (conf_dir() / "model" / "tiny.yaml").is_file()
    assert sbatch_template().is_file() and "{{directives}}" in sbatch_template().read_text()


def test_the_users_options_extend_the_launchers() -> None:
    groups = merged_group_options(CONF, [EXAMPLE_CONF])
    assert {"tiny", "small", "my_net"} <= set(groups["model"])
    assert {"reverse", "tokens", "my_corpus"} <= set(groups["data"])
    assert "my_run" in groups["experiment"] and "ddp" in groups["engine"]


def test_a_users_option_passes_and_a_typo_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLE_CONF.parent)
    own = user_configs("conf", [])
    assert own.dirs == [EXAMPLE_CONF] and own.complete
    ok = ["model=my_net", "data=my_corpus", "model.d_model=64", "+experiment=my_run"]
    check_overrides(ok, CONF, user_dirs=own.dirs)
    with pytest.raises(ConfigError) as info:
        check_overrides(["model=my_nett"], CONF, user_dirs=own.dirs)
    assert "did you mean model=my_net?" in str(info.value)
    with pytest.raises(ConfigError):  # without the user's directory, my_net is unknown
        check_overrides(["model=my_net"], CONF)


def test_searchpath_entries_and_missing_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "model").mkdir(parents=True)
    assert user_configs(None, ["hydra.searchpath=[file://mine]"]).dirs == [tmp_path / "mine"]
    assert user_configs(None, [f"hydra.searchpath=[{tmp_path / 'mine'}]"]).dirs == [
        tmp_path / "mine"
    ]
    unknown = user_configs(None, ["hydra.searchpath=[pkg://no_such_package.conf]"])
    assert unknown.dirs == [] and not unknown.complete  # left to Hydra: groups not checked
    assert not user_configs(None, [], config_name="mine").complete
    for flag, overrides in (("nope", []), (None, ["hydra.searchpath=[file://nope]"])):
        with pytest.raises(ConfigError) as info:
            user_configs(flag, overrides)
        assert "nope is not a directory" in str(info.value)
    with pytest.raises(ConfigError, match="list of config locations"):
        user_configs(None, ["hydra.searchpath=file://mine"])


@pytest.mark.parametrize(
    "overrides", [["model=my_net", "data=my_corpus"], ["+experiment=my_run"]], ids=["groups", "exp"]
)
def test_the_examples_configs_compose_and_validate(
    overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hydra import compose, initialize_config_dir

    from launcher.config.load import to_root_config
    from launcher.config.model import UserModelConfig
    from launcher.config.searchpath import searchpath_override
    from launcher.config.store import register_configs

    monkeypatch.chdir(EXAMPLE_CONF.parent)
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, searchpath_override([EXAMPLE_CONF])])
    root = to_root_config(cfg)
    assert isinstance(root.model, UserModelConfig)
    assert root.model._target_ == "my_project.models.MyNet" and root.model.kwargs["vocab_size"]
    assert root.data.name.value == "tokens" and root.data.path and root.data.val_path
