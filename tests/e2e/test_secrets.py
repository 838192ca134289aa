"""Credentials in the environment, or typed into the config, reach no file under the run directory
(config.yaml, plan.json, Hydra's copies, metrics, summary, checkpoints, wandb's offline files) and
no log line; and a plain offline run prints the launcher's lines only (issue 17, item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import FAST, run_launch

pytestmark = pytest.mark.e2e

WANDB_KEY = "SENTINELwandbkey0123456789abcdef0123456789"
SERVICE_TOKEN = "SENTINELservicetoken42"
TYPED_TOKEN = "SENTINELtypedintoconfig77"


def files_containing(run_dir: Path, needle: str) -> list[Path]:
    raw = needle.encode()
    return [p for p in sorted(run_dir.rglob("*")) if p.is_file() and raw in p.read_bytes()]


def test_no_file_under_the_run_directory_holds_a_secret(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [a for a in FAST if not a.startswith("wandb.")]
    proc = run_launch(
        [
            "train",
            *args,
            "train.steps=2",
            "batch.global_size=8",
            "wandb.mode=offline",
            # A secret typed into a config string (here a SLURM setup line, kept in config.yaml).
            f"cluster.setup=['export HF_TOKEN={TYPED_TOKEN}','module load cuda']",
        ],
        run_dir,
        env={
            "WANDB_API_KEY": WANDB_KEY,
            "MY_SERVICE_TOKEN": SERVICE_TOKEN,
            "WANDB_SILENT": "false",
        },
    )
    for written in ("wandb/run_id.txt", ".hydra/overrides.yaml", "checkpoints", "summary.json"):
        assert (run_dir / written).exists(), written
    assert "export HF_TOKEN=REDACTED" in (run_dir / "config.yaml").read_text()
    for secret in (WANDB_KEY, SERVICE_TOKEN, TYPED_TOKEN):
        assert files_containing(run_dir, secret) == [], secret
        assert secret not in proc.stdout + proc.stderr
    # Issue 17, item 5, with wandb's console on as a user's is (the key and the setup line change
    # nothing wandb prints): none of wandb's lines, the launcher's one at the start and one at
    # the end, and the recompute policy said once (the plan's "recompute: none").
    out = proc.stdout + proc.stderr
    assert not [line for line in out.splitlines() if line.startswith("wandb:")], out
    assert len([line for line in out.splitlines() if line.startswith("wandb run ")]) == 2, out
    assert "recompute: ac=none" not in out


def test_a_sweep_leaves_no_credential_in_hydra_files_or_the_summary(tmp_path: Path) -> None:
    """Hydra writes the overrides to .hydra/ and multirun.yaml before a point runs, even a point
    whose config is refused (here: a credential in cluster.setup)."""
    sentinel = "hf_sweepsentinel0123456789"
    sweep_dir = tmp_path / "sweep"
    run_launch(
        [
            "plan",
            "-m",
            "cluster=slurm",
            f"cluster.setup=['export HF_TOKEN={sentinel}']",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        check=False,
    )
    files = [p for p in sweep_dir.rglob("*") if p.is_file()]
    assert any(p.name == "multirun.yaml" for p in files)
    assert [p for p in files if sentinel.encode() in p.read_bytes()] == []


def test_a_token_in_an_apptainer_setup_line_is_refused(tmp_path: Path) -> None:
    """Issue 17, item 11: `export HF_TOKEN=...` was refused, `--env=HF_TOKEN=...` written."""
    run_dir = tmp_path / "run"
    sentinel = "hf_apptainersentinel0123"
    proc = run_launch(
        [
            "plan",
            "cluster=slurm",
            f"cluster.setup=['apptainer exec --env=HF_TOKEN={sentinel} img.sif true']",
        ],
        run_dir,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: cluster.setup[0]: would write a credential")
    assert sentinel not in proc.stdout + proc.stderr
    assert not (run_dir / "train.sbatch").exists()
