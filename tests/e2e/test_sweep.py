"""`launch train -m` sweeps end to end: run directories, the self-checking summary, failing
points."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from launcher.exit_codes import STOPPED_RESUMABLE
from tests.helpers import FAST, REPO, read_losses, run_launch
from tests.served import popen

pytestmark = pytest.mark.e2e

SHORT = [*FAST, "train.steps=4", "checkpoint.enabled=false"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_rows(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "sweep_summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def by_label(rows: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {row["label"]: row for row in rows}


@pytest.fixture(scope="module")
def accumulation_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The issue's sweep: one global batch of 16 split into 1, 2 and 4 micro-batches."""
    sweep_dir = tmp_path_factory.mktemp("sweeps") / "accum_sweep"
    run_launch(
        [
            "train",
            "-m",
            "batch.global_size=16",
            "batch.grad_accum=1,2,4",
            *SHORT,
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    return sweep_dir


def test_accumulation_sweep_runs_every_point_and_they_agree(accumulation_sweep: Path) -> None:
    for point in ("0", "1", "2"):
        assert (accumulation_sweep / point / "summary.json").is_file()
        assert len(read_losses(accumulation_sweep / point)) == 4
    rows = read_rows(accumulation_sweep)
    assert [(r["grad_accum"], r["micro_size"], r["status"]) for r in rows] == [
        ("1", "16", "ok"),
        ("2", "8", "ok"),
        ("4", "4", "ok"),
    ]
    assert [r["check"] for r in rows] == ["reference", "agrees", "agrees"]
    assert all(r["reference"] == "0" for r in rows)
    assert all(float(r["max_rel_loss_diff"]) <= 1e-5 for r in rows)
    assert all(r["common_steps"] == "4" and float(r["tokens_per_s"]) > 0 for r in rows)
    assert [r["label"] for r in rows] == ["grad_accum=1", "grad_accum=2", "grad_accum=4"]
    markdown = (accumulation_sweep / "sweep_summary.md").read_text()
    assert (
        "3 point(s): 3 ok; 2 loss curve(s) compared with their reference, none differs" in markdown
    )
    assert (accumulation_sweep / "sweep_summary.png").read_bytes().startswith(PNG_MAGIC)


def test_sweep_points_share_a_wandb_group_named_after_the_sweep(accumulation_sweep: Path) -> None:
    for point in ("0", "1", "2"):
        config = yaml.safe_load((accumulation_sweep / point / "config.yaml").read_text())
        assert config["wandb"]["group"] == "accum_sweep"


def test_standalone_command_rewrites_the_summary_from_the_directory(
    accumulation_sweep: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copied_sweep"
    shutil.copytree(accumulation_sweep, copy)
    for name in ("sweep_summary.csv", "sweep_summary.md", "sweep_summary.png"):
        (copy / name).unlink()
    proc = run_launch(["sweep-summary", str(copy)])
    assert "| grad_accum=4 |" in proc.stdout
    assert read_rows(copy) == read_rows(accumulation_sweep)
    assert (copy / "sweep_summary.md").is_file()
    assert (copy / "sweep_summary.png").read_bytes().startswith(PNG_MAGIC)


def test_standalone_command_names_a_missing_directory(tmp_path: Path) -> None:
    proc = run_launch(["sweep-summary", str(tmp_path / "nowhere")], check=False)
    assert proc.returncode == 2
    assert "does not exist" in proc.stdout + proc.stderr


# One sweep over hand-picked points, each a config file in a `point` group on Hydra's search path.
POINTS = {
    "ref": "batch: {global_size: 16, grad_accum: 1}",
    "bad_split": "batch: {global_size: 16, grad_accum: 3}",
    "torchrun_fails": "batch: {global_size: 16, grad_accum: 1}\nparallel: {dp: 2}",
    "accum4": "batch: {global_size: 16, grad_accum: 4}",
    "seed1": "batch: {global_size: 16, grad_accum: 2}\ntrain: {seed: 1}",
    "global8": "batch: {global_size: 8, grad_accum: 2}",
    "broken": "batch: {global_size: 16, grad_accum: 4}\ndebug: {broken_normalization: true}",
    "dp2": "batch: {global_size: 16, grad_accum: 2}\nparallel: {dp: 2}",
}


@pytest.fixture(scope="module")
def mixed_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("mixed")
    sweep_dir = root / "sweep"
    for name, body in POINTS.items():
        path = root / "conf" / "point" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# @package _global_\n" + body + "\n")
    # The torchrun job of one point fails for real: its ranks exit at interpreter start.
    failing = sweep_dir / str(list(POINTS).index("torchrun_fails")) / "config.yaml"
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(
        textwrap.dedent(f"""\
            import os, sys
            if "LOCAL_RANK" in os.environ and sys.orig_argv[-1] == {str(failing)!r}:
                os._exit(3)
            """)
    )
    proc = run_launch(
        [
            "train",
            "-m",
            f"hydra.searchpath=[file://{root / 'conf'}]",
            f"+point={','.join(POINTS)}",
            *SHORT,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        env={"PYTHONPATH": str(root / "site")},
        in_process=True,  # the sitecustomize acts in torchrun's ranks only
    )
    assert "sweep summary:" in proc.stdout + proc.stderr  # a warning when points failed
    return sweep_dir, proc.returncode


def test_points_are_compared_only_with_the_same_global_batch_and_seed(
    mixed_sweep: tuple[Path, int],
) -> None:
    rows = by_label(read_rows(mixed_sweep[0]))
    assert rows["point=ref"]["check"] == "reference"
    assert rows["point=accum4"]["check"] == "agrees" and rows["point=accum4"]["reference"] == "0"
    assert rows["point=dp2"]["check"] == "agrees" and rows["point=dp2"]["reference"] == "0"
    assert float(rows["point=dp2"]["max_rel_loss_diff"]) <= 1e-5
    # A different seed or global batch is a different problem: its own reference, not a failure.
    for label in ("point=seed1", "point=global8"):
        assert rows[label]["check"] == "reference"
        assert rows[label]["reference"] == rows[label]["point"]


def test_the_broken_normalization_negative_control_is_flagged(
    mixed_sweep: tuple[Path, int],
) -> None:
    sweep_dir, _ = mixed_sweep
    row = by_label(read_rows(sweep_dir))["point=broken"]
    assert row["status"] == "ok" and row["reference"] == "0"
    assert row["check"] == "DIFFERS"
    assert float(row["max_rel_loss_diff"]) > 1e-5
    assert "DIFFER" in (sweep_dir / "sweep_summary.md").read_text()


def test_failing_points_fail_alone_with_their_reason(mixed_sweep: tuple[Path, int]) -> None:
    sweep_dir, code = mixed_sweep
    assert code == 0  # the sweep itself completed
    rows = by_label(read_rows(sweep_dir))
    bad = rows["point=bad_split"]
    assert bad["status"] == "failed"
    assert "batch.grad_accum" in bad["note"] and "Fix:" in bad["note"]
    crashed = rows["point=torchrun_fails"]
    assert crashed["status"] == "failed"
    assert "exit status" in crashed["note"]
    # Points after the failing ones still ran.
    assert rows["point=dp2"]["status"] == "ok"
    assert sum(r["status"] == "ok" for r in rows.values()) == len(POINTS) - 2
    markdown = (sweep_dir / "sweep_summary.md").read_text()
    assert "## Failed points" in markdown and "(point=bad_split): batch." in markdown


def test_standalone_command_exits_non_zero_when_a_point_failed_or_differs(
    mixed_sweep: tuple[Path, int],
) -> None:
    proc = run_launch(["sweep-summary", str(mixed_sweep[0])], check=False)
    assert proc.returncode == 1
    assert "DIFFER" in proc.stdout


def test_a_crashing_in_process_point_does_not_stop_the_sweep(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    run_launch(
        [
            "train",
            "-m",
            "debug.raise_at_step=2,null",
            "batch.global_size=8",
            *SHORT,
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    rows = read_rows(sweep_dir)
    assert [r["status"] for r in rows] == ["failed", "ok"]
    assert "RuntimeError" in rows[0]["note"]
    assert "Traceback" in (sweep_dir / "0" / "error.txt").read_text()


def test_a_stop_signal_stops_the_whole_sweep_resumably(tmp_path: Path) -> None:
    sweep_dir, log_path = tmp_path / "sweep", tmp_path / "launch.log"
    args = ["train", "-m", "batch.grad_accum=1,2", "batch.global_size=8", *FAST]
    args += ["train.steps=500", f"hydra.sweep.dir={sweep_dir}"]
    metrics = sweep_dir / "0" / "metrics.jsonl"
    # The output is read once it has ended: a file, so the launch can be forked (tests/served.py).
    with open(log_path, "wb") as log:
        proc = popen(args, REPO, dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(1200):  # wait (at most 2 minutes) for the first point's first step
                if (metrics.is_file() and metrics.read_text().strip()) or proc.poll() is not None:
                    break
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = log_path.read_text(errors="replace")
    assert proc.returncode == STOPPED_RESUMABLE, output
    assert not (sweep_dir / "1").exists()  # the next point never started
    assert "hydra.sweep.dir=" in output  # how to resume
    summary = run_launch(["sweep-summary", str(sweep_dir)], check=False)
    assert summary.returncode == 0  # stopped is not failed
    assert read_rows(sweep_dir)[0]["status"] == "stopped"
