"""What a sweep point records: its wandb group and why it failed; the sweep presets compose."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose

from launcher.config import to_root_config
from launcher.exit_codes import STOPPED_RESUMABLE
from launcher.sweep.job import (
    join_sweep,
    record_crash,
    record_exit,
    record_failure,
    start_point,
    sweep_name,
)
from launcher.sweep.points import read_point

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_the_sweep_name_is_its_directory_name_with_the_date_for_timestamps(tmp_path: Path) -> None:
    assert sweep_name(tmp_path / "accum_sweep") == "accum_sweep"
    assert sweep_name(tmp_path / "2024-05-01" / "12-30-00") == "2024-05-01_12-30-00"


def test_points_join_the_sweeps_wandb_group_unless_one_is_set(tmp_path: Path) -> None:
    cfg = to_root_config({})
    assert join_sweep(cfg, tmp_path / "lr_sweep").wandb.group == "lr_sweep"
    mine = to_root_config({"wandb": {"group": "mine"}})
    assert join_sweep(mine, tmp_path / "lr_sweep").wandb.group == "mine"


def test_a_failure_reason_is_one_line_first(tmp_path: Path) -> None:
    record_failure(tmp_path / "0", "batch.grad_accum: bad\n  value.", details="more")
    assert read_point(tmp_path / "0", "0").error == "batch.grad_accum: bad value."
    assert (tmp_path / "0" / "error.txt").read_text().endswith("\nmore\n")


def test_a_crash_keeps_its_traceback(tmp_path: Path) -> None:
    try:
        raise RuntimeError("CUDA out of memory")
    except RuntimeError as exc:
        assert record_crash(tmp_path, exc) == 1
    text = (tmp_path / "error.txt").read_text()
    assert text.startswith("RuntimeError: CUDA out of memory\n")
    assert "Traceback" in text


def test_a_failed_job_names_its_status_and_the_ranks_errors(tmp_path: Path) -> None:
    (tmp_path / "error_rank1.txt").write_text("Traceback ...\nValueError: rank 1 broke\n")
    assert record_exit(tmp_path, 1) is False  # the sweep goes on
    reason = read_point(tmp_path, "0").error
    assert reason == "the job failed with exit status 1 (rank 1: ValueError: rank 1 broke)"


def test_a_stop_on_a_signal_stops_the_sweep_and_is_not_a_failure(tmp_path: Path) -> None:
    assert record_exit(tmp_path, STOPPED_RESUMABLE) is True
    assert not (tmp_path / "error.txt").exists()


def test_a_point_run_again_forgets_its_earlier_failure(tmp_path: Path) -> None:
    record_failure(tmp_path / "3", "out of memory")
    start_point(to_root_config({}), tmp_path / "3", tmp_path)
    assert not (tmp_path / "3" / "error.txt").exists()


@pytest.mark.parametrize(
    ("overrides", "axes"),
    [
        (["+sweep=accumulation"], {"batch.grad_accum", "ac.policy"}),
        (["+sweep=splits"], {"parallel.dp", "batch.grad_accum"}),
        (["+experiment=accumulation"], {"batch.grad_accum", "ac.policy"}),
        (["+experiment=accumulation", "sweep=splits"], {"parallel.dp", "batch.grad_accum"}),
    ],
)
def test_sweep_presets_sweep_splits_of_one_global_batch(
    hydra_conf, overrides: list[str], axes: set[str]
) -> None:
    cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    params = dict(cfg.hydra.sweeper.params)
    assert set(params) == axes
    assert "sweep_summary" in cfg.hydra.callbacks
    plain = compose(config_name="config", overrides=overrides)
    root = to_root_config(plain)
    assert root.batch.micro_size is None  # derived per point, so every point keeps the global batch
    for accum in str(params["batch.grad_accum"]).split(","):
        for dp in str(params.get("parallel.dp", "1")).split(","):
            point = to_root_config(
                compose(
                    config_name="config",
                    overrides=[*overrides, f"batch.grad_accum={accum}", f"parallel.dp={dp}"],
                )
            )
            assert point.split().global_size == root.split().global_size
