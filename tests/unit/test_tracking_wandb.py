"""The wandb check before anything starts, credential lookup and the stored run id (no network)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from launcher.config import to_root_config
from launcher.config.wandb import WandbMode
from launcher.errors import ConfigError
from launcher.tracking.wandb_run import check_wandb, has_credentials, init_arguments, run_id


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_credentials_from_environment_or_netrc(no_credentials: Path) -> None:
    assert not has_credentials()
    assert has_credentials({"WANDB_API_KEY": "x" * 40})
    netrc = no_credentials / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "x" * 40 + "\n")
    netrc.chmod(0o600)
    assert has_credentials()
    assert not has_credentials(
        {"HOME": str(no_credentials), "WANDB_BASE_URL": "https://wandb.example.com"}
    )


def test_online_without_a_key_is_one_clear_error(no_credentials: Path) -> None:
    cfg = to_root_config({"wandb": {"mode": "online"}})
    with pytest.raises(ConfigError) as err:
        check_wandb(cfg)
    assert err.value.keys == ["wandb.mode", "wandb.required"]
    assert "WANDB_API_KEY" in str(err.value) and "wandb.mode=offline" in str(err.value)


def test_online_without_a_key_may_continue_without_wandb(
    no_credentials: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = to_root_config({"wandb": {"mode": "online", "required": False}})
    monkeypatch.setattr(logging.getLogger("launcher"), "propagate", True)  # let caplog see it
    with caplog.at_level(logging.WARNING, logger="launcher"):
        checked = check_wandb(cfg)
    assert checked.wandb.mode == WandbMode.disabled
    assert "continues without wandb" in caplog.text


def test_offline_and_disabled_need_no_key(no_credentials: Path) -> None:
    for mode in ("offline", "disabled"):
        cfg = to_root_config({"wandb": {"mode": mode}})
        assert check_wandb(cfg) is cfg


def test_run_id_is_stored_and_reused(tmp_path: Path) -> None:
    first = run_id(tmp_path)
    assert (tmp_path / "wandb" / "run_id.txt").read_text().strip() == first
    assert run_id(tmp_path) == first
    assert run_id(tmp_path / "other") != first


def test_what_wandb_receives_is_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17, item 11: wandb.name and wandb.tags reached the run file unredacted."""
    monkeypatch.setenv("MY_SERVICE_TOKEN", "envsecret0123456789")
    argv = ["launch train", "wandb.group=g PASSWORD=argvpw12"]
    monkeypatch.setattr(sys, "argv", argv)
    cfg = to_root_config(
        {
            "wandb": {
                "name": "x --api-key=SECRET",
                "group": "g PASSWORD=argvpw12",
                "tags": ["HF_TOKEN=hf_SECRETSECRET", "plain", "echo envsecret0123456789"],
            }
        }
    )
    user, secrets = init_arguments(cfg, tmp_path / "run", {"note": "PASSWORD=derived1"})
    assert user["name"] == "x --api-key=REDACTED"
    assert user["group"] == "g PASSWORD=REDACTED"
    assert user["tags"] == ["HF_TOKEN=REDACTED", "plain", "echo REDACTED"]
    assert user["config"]["wandb"]["name"] == "x --api-key=REDACTED"
    assert user["config"]["derived"] == {"note": "PASSWORD=REDACTED"}
    text = repr(user)
    for secret in ("=SECRET", "argvpw12", "envsecret0123456789", "derived1"):
        assert secret not in text, secret
    assert secrets.data(argv)[1] == "wandb.group=g PASSWORD=REDACTED"  # what wandb records
