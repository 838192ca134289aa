"""What wandb receives holds no credential (issue 17, item 11).

`wandb.name="x --api-key=..."` and `wandb.tags=["HF_TOKEN=..."]` were redacted in config.yaml but
reached the wandb run file (`run-*.wandb`, what `wandb sync` uploads) as typed: the run's name,
tags and group went to wandb.init unredacted, in single runs and in sweeps alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import FAST, run_launch

pytestmark = pytest.mark.e2e

LONG = "SENTINELapikey0123456789"
SHORT = "Zq9Xw2"  # shorter than a value replaced everywhere; assigned with a flag all the same
TAG = "hf_SENTINELtag0123456789"
GROUP_PW = "SENTINELgrouppw42"
ENV = "SENTINELenvtoken0123456789"

ARGS = [
    *[a for a in FAST if not a.startswith("wandb.")],
    "train.steps=2",
    "batch.global_size=4",
    "wandb.mode=offline",
    f"wandb.name='x --api-key={LONG} --token={SHORT}'",
    f"wandb.tags=['HF_TOKEN={TAG}',plain]",
    f"wandb.group='g PASSWORD={GROUP_PW}'",
]


def wandb_files(root: Path) -> list[Path]:
    files = [p for p in root.rglob("wandb/**/*") if p.is_file()]
    assert any(p.name.endswith(".wandb") for p in files), files
    return files


def leaks(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in wandb_files(root):
        data = path.read_bytes()
        for secret in (LONG, f"={SHORT}", TAG, GROUP_PW, ENV):
            if secret.encode() in data:
                found.setdefault(secret, []).append(str(path.relative_to(root)))
    return found


def test_the_wandb_run_file_holds_no_secret(tmp_path: Path) -> None:
    """A sweep's points: each point's argv holds every override. A single run goes through the
    same wandb.init arguments (init_arguments, tests/unit/test_tracking_wandb.py), and a single
    offline run's files hold no secret of the environment (tests/e2e/test_secrets.py)."""
    root = tmp_path / "sweep"
    args = ["train", "-m", *ARGS, "train.seed=0,1", f"hydra.sweep.dir={root}"]
    run_launch(args, env={"MY_SERVICE_TOKEN": ENV})
    assert len(list(root.glob("*/wandb/offline-run-*/run-*.wandb"))) == 2
    assert leaks(root) == {}
    # The redacted values are there: the name and tags were passed, not dropped.
    run_file = next(root.rglob("run-*.wandb")).read_bytes()
    assert b"HF_TOKEN=REDACTED" in run_file and b"--api-key=REDACTED" in run_file
