"""A wandb that cannot work (online without a key, a broken install) is one clear error before
anything starts, or with wandb.required=false a warning and the run trains without it.
Nothing here touches the network: the missing key is found before wandb is asked to connect."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import FAST, read_summary, run_launch

pytestmark = pytest.mark.e2e

SMALL = [a for a in FAST if not a.startswith("wandb.")] + [
    "batch.global_size=8",
    "batch.micro_size=4",
    "train.steps=2",
    "checkpoint.enabled=false",
]


@pytest.fixture
def no_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """An environment with no W&B credentials anywhere (and wandb itself told to go online)."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "WANDB_MODE": "online"}


@pytest.fixture
def broken_wandb(tmp_path: Path) -> dict[str, str]:
    """A `wandb` package that fails on import, ahead of the real one on the path."""
    package = tmp_path / "shadow" / "wandb"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('simulated broken install')\n")
    return {"PYTHONPATH": str(package.parent)}


def assert_nothing_started(run_dir: Path) -> None:
    assert not (run_dir / "config.yaml").exists()
    assert not (run_dir / "metrics.jsonl").exists()
    assert not (run_dir / "wandb").exists()


# Online without a key and wandb.required=true (the default): refused at start, nothing written,
# in tests/e2e/test_first_hour.py (its Fix printed as written) and
# tests/unit/test_tracking_wandb.py.


def test_online_without_a_key_warns_and_trains(tmp_path: Path, no_key: dict[str, str]) -> None:
    run_dir = tmp_path / "run"
    proc = run_launch(
        ["train", *SMALL, "wandb.mode=online", "wandb.required=false"], run_dir, env=no_key
    )
    assert "warning: wandb.mode=online needs a W&B API key" in proc.stdout + proc.stderr
    assert read_summary(run_dir)["steps"] == 2
    assert read_summary(run_dir)["wandb_run_id"] is None
    assert not (run_dir / "wandb").exists()


def test_broken_install_fails_at_start(tmp_path: Path, broken_wandb: dict[str, str]) -> None:
    run_dir = tmp_path / "run"
    proc = run_launch(
        ["train", *SMALL, "wandb.mode=offline"], run_dir, env=broken_wandb, check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "wandb cannot be imported" in output and "simulated broken install" in output
    assert "Traceback" not in output
    assert_nothing_started(run_dir)


def test_broken_install_warns_and_trains(tmp_path: Path, broken_wandb: dict[str, str]) -> None:
    run_dir = tmp_path / "run"
    proc = run_launch(
        ["train", *SMALL, "wandb.mode=offline", "wandb.required=false"], run_dir, env=broken_wandb
    )
    output = proc.stdout + proc.stderr
    assert output.count("wandb cannot be imported") == 1  # said once: the ranks do not retry
    assert read_summary(run_dir)["steps"] == 2 and not (run_dir / "wandb").exists()
