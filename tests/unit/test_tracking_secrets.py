"""What counts as a secret, and that redaction removes it from text, data and files."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config import to_root_config
from launcher.config.load import to_plain, to_yaml
from launcher.secrets import (
    REDACTED,
    changed_keys,
    environment_secrets,
    is_secret_name,
    redact,
    redact_tree,
    redactor_for,
)

KEY = "0123456789abcdef0123456789abcdef01234567"  # shaped like a W&B API key
TOKEN = "hf_AbCdEfGhIjKlMnOp"


@pytest.mark.parametrize(
    "name",
    [
        "WANDB_API_KEY",
        "HF_TOKEN",
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "MYSQL_PASSWD",
        "client_secret",
        "api_key",
        "apikey",
        "token",
        "api-key",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "HOME",
        "MONKEY",
        "tokens",
        "tokens_per_s",
        "max_tokens",
        "tokenizer",
        "KEYBOARD",
        "SSH_AUTH_SOCK",
        "WANDB_MODE",
        "WANDB_PROJECT",
    ],
)
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_environment_values_above_the_minimum_length() -> None:
    env = {"WANDB_API_KEY": KEY, "HF_TOKEN": TOKEN, "SHORT_TOKEN": "1", "HOME": "/home/someone"}
    assert environment_secrets(env) == {KEY, TOKEN}


def test_text_loses_environment_and_assigned_secrets() -> None:
    text = (
        f"export WANDB_API_KEY={KEY}\n"
        f"HF_TOKEN='{TOKEN}' python train.py --db-password=hunter2hunter2 --api-key s3cr3tv4lue\n"
        "echo the same key again: " + KEY + "\n"
        "OMP_NUM_THREADS=4 --seed 1234567890\n"
    )
    clean = redact(text, env={})
    for secret in (KEY, TOKEN, "hunter2hunter2", "s3cr3tv4lue"):
        assert secret not in clean
    assert f"export WANDB_API_KEY={REDACTED}" in clean
    assert "OMP_NUM_THREADS=4 --seed 1234567890" in clean  # not credentials: untouched


def test_data_keys_values_and_lists() -> None:
    data = {
        "wandb": {"api_key": KEY, "project": "launcher"},
        "cluster": {"setup": [f"export HF_TOKEN={TOKEN}", "module load cuda"]},
        "notes": [f"copied {TOKEN} here", ("tuple", KEY)],
        "steps": 10,
        "token": "short",
    }
    clean = redact(data, env={})
    assert clean["wandb"] == {"api_key": REDACTED, "project": "launcher"}
    assert clean["cluster"]["setup"] == [f"export HF_TOKEN={REDACTED}", "module load cuda"]
    assert clean["notes"] == [f"copied {REDACTED} here", ("tuple", REDACTED)]
    assert clean["steps"] == 10 and clean["token"] == "short"
    assert data["wandb"]["api_key"] == KEY  # a copy; the input is unchanged


def test_config_yaml_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    cfg = to_root_config({"cluster": {"setup": [f"export HF_TOKEN={TOKEN}", f"echo {KEY}"]}})
    secrets = redactor_for(to_plain(cfg))
    text = secrets.text(to_yaml(cfg))
    assert KEY not in text and TOKEN not in text and "export HF_TOKEN=REDACTED" in text


def test_redact_tree(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "overrides.yaml").write_text(f"- cluster.setup=[export HF_TOKEN={TOKEN}]\n")
    (tmp_path / "clean.yaml").write_text("a: 1\n")
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    changed = redact_tree(tmp_path, redactor_for(env={}))  # no environment secrets: the file's own
    assert changed == []  # a redactor built from nothing knows no values
    changed = redact_tree(tmp_path)
    assert changed == [tmp_path / "sub" / "overrides.yaml"]
    assert TOKEN not in (tmp_path / "sub" / "overrides.yaml").read_text()
    assert redact_tree(tmp_path / "missing") == []


def test_changed_keys_name_what_redaction_touched() -> None:
    data = {"cluster": {"setup": [f"export HF_TOKEN={TOKEN}"], "time": "01:00:00"}, "steps": 3}
    assert changed_keys(data, redact(data, env={})) == ["cluster.setup"]
    assert changed_keys(data, data) == []


def test_a_credential_key_hides_its_whole_value() -> None:
    data = {
        "db": {"password": "correct horse battery staple"},
        "note": "pw: correct horse battery staple",
    }
    assert redact(data, env={}) == {"db": {"password": REDACTED}, "note": f"pw: {REDACTED}"}


# Issue 17, item 11.
def test_an_assignment_inside_another_is_found() -> None:
    """`--env=HF_TOKEN=...` and `pw: PASSWORD=...`: the outer assignment hid the inner one."""
    line = f"apptainer exec --env=HF_TOKEN={TOKEN} img.sif true"
    assert redact(line, env={}) == f"apptainer exec --env=HF_TOKEN={REDACTED} img.sif true"
    assert redact("pw: PASSWORD=hunter2hunter2", env={}) == f"pw: PASSWORD={REDACTED}"
    assert redact("MONKEY=bananas1234 x_MONKEY=bananas1234", env={}) == (
        "MONKEY=bananas1234 x_MONKEY=bananas1234"  # no credential name starts inside a word
    )


def test_a_short_assigned_secret_is_replaced_where_it_is_assigned() -> None:
    """`PASSWORD=SECRET`, `--api-key=SECRET`: shorter than a value replaced everywhere, but
    assigned with `=` or a flag, so a credential all the same."""
    data = {"name": "x --api-key=SECRET", "note": "pw: PASSWORD=SECRET", "other": "SECRET"}
    assert redact(data, env={}) == {
        "name": f"x --api-key={REDACTED}",
        "note": f"pw: PASSWORD={REDACTED}",
        "other": "SECRET",  # a short word elsewhere is just a word
    }
    assert changed_keys(data, redact(data, env={})) == ["name", "note"]
    assert redact("HF_TOKEN: not set", env={}) == "HF_TOKEN: not set"  # prose, not a value


def test_a_shell_reference_is_not_a_secret() -> None:
    for line in ("export HF_TOKEN=$HF_TOKEN", "apptainer exec --env=HF_TOKEN=${HF_TOKEN} i.sif"):
        assert redact(line, env={}) == line


def test_nan_is_no_credential() -> None:
    """optim.grad_clip=nan was reported as "holds a credential": nan != nan."""
    plain = {"optim": {"grad_clip": float("nan")}, "list": [float("nan")]}
    assert changed_keys(plain, redactor_for(plain, env={}).data(plain)) == []
    assert changed_keys({"a": float("nan")}, {"a": float("nan")}) == []


def test_a_credential_in_an_apptainer_setup_line_is_refused(tmp_path: Path) -> None:
    from launcher.errors import ConfigError
    from launcher.runners.slurm import render_sbatch

    line = f"apptainer exec --env=HF_TOKEN={TOKEN} img.sif true"
    cfg = to_root_config({"cluster": {"name": "slurm", "setup": ["module load x", line]}})
    with pytest.raises(ConfigError) as info:
        render_sbatch(cfg, tmp_path)
    assert info.value.keys == ["cluster.setup[1]"]
    ok = to_root_config({"cluster": {"name": "slurm", "setup": [line.replace(TOKEN, "$HF_TOKEN")]}})
    assert "--env=HF_TOKEN=$HF_TOKEN" in render_sbatch(ok, tmp_path)
