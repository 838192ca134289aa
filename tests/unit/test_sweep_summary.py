"""The sweep summary from run directories written here: references, flags, statuses, files."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from launcher.config import to_root_config
from launcher.config.load import to_yaml
from launcher.errors import LauncherError
from launcher.sweep.compare import Check, Verdict, compare_points, max_rel_diff
from launcher.sweep.points import Status, find_points, read_point
from launcher.sweep.report import write_summary
from launcher.sweep.summary import summarize

CURVE = [5.5, 5.25, 5.0, 4.75]


def make_point(
    sweep_dir: Path,
    name: str,
    *,
    settings: dict[str, Any] | None = None,
    losses: list[float] | None = None,
    overrides: list[str] | None = None,
    summary: dict[str, Any] | None = None,
    finished: bool = True,
    error: str | None = None,
    step_times: list[float] | None = None,
) -> Path:
    """A run directory as `launch train` leaves it (config.yaml, plan.json, metrics, summary)."""
    run = sweep_dir / name
    run.mkdir(parents=True)
    if overrides is not None:
        (run / ".hydra").mkdir()
        (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if error is not None:
        (run / "error.txt").write_text(error + "\n\nTraceback (most recent call last): ...\n")
    if settings is None:
        return run
    cfg = to_root_config(settings)
    split = cfg.split()
    (run / "config.yaml").write_text(to_yaml(cfg))
    plan = {"world_size": split.dp, "global_size": split.global_size,
            "micro_size": split.micro_size, "grad_accum": split.grad_accum,
            "engine": cfg.engine.name.value, "ac": cfg.ac.policy.value,
            "precision": cfg.train.precision.value}  # fmt: skip
    (run / "plan.json").write_text(json.dumps(plan))
    losses = CURVE if losses is None else losses
    times = step_times or [0.5] * len(losses)
    with open(run / "metrics.jsonl", "w") as f:
        for step, (loss, seconds) in enumerate(zip(losses, times, strict=True), start=1):
            f.write(
                json.dumps({"step": step, "loss": loss, "tokens": 100, "step_time_s": seconds})
                + "\n"
            )
    if finished:
        figures = {"steps": len(losses), "final_loss": losses[-1] if losses else None,
                   "tokens_per_s": 123.0, "peak_memory_bytes": 3 * 2**20,
                   "dp": split.dp}  # fmt: skip
        (run / "summary.json").write_text(json.dumps({**figures, **(summary or {})}))
    return run


def split(global_size: int, accum: int, dp: int = 1, **more: dict[str, Any]) -> dict[str, Any]:
    return {
        "batch": {"global_size": global_size, "grad_accum": accum},
        "parallel": {"dp": dp},
        **more,
    }


def verdicts(sweep_dir: Path) -> list[tuple[str | None, Verdict]]:
    points = find_points(sweep_dir)
    return [(c.reference, c.verdict) for c in compare_points(points)]


def test_each_point_is_compared_with_the_first_point_of_the_same_problem(tmp_path: Path) -> None:
    off = [x * (1 + 3e-5) for x in CURVE]
    make_point(tmp_path, "0", settings=split(16, 1))
    make_point(
        tmp_path,
        "1",
        settings=split(16, 4, dp=2, ac={"policy": "full"}),
        losses=[x * (1 + 2e-6) for x in CURVE],
    )
    make_point(tmp_path, "2", settings=split(16, 2, train={"seed": 1}), losses=off)
    make_point(tmp_path, "3", settings=split(8, 2), losses=off)
    make_point(
        tmp_path, "4", settings=split(16, 2, debug={"broken_normalization": True}), losses=off
    )
    make_point(tmp_path, "5", settings=split(16, 4, optim={"lr": 1e-3}), losses=off)
    make_point(tmp_path, "6", settings=split(8, 1), losses=off)
    assert verdicts(tmp_path) == [
        ("0", Verdict.reference),
        ("0", Verdict.agrees),  # another split of the same global batch: within 1e-5
        ("2", Verdict.reference),  # another seed: its own reference
        ("3", Verdict.reference),  # another global batch: its own reference
        (
            "0",
            Verdict.differs,
        ),  # the negative control is compared with the correct run, and flagged
        ("5", Verdict.reference),  # another learning rate: another problem
        ("3", Verdict.agrees),
    ]


def test_a_derived_global_size_is_compared_by_its_resolved_value(tmp_path: Path) -> None:
    make_point(tmp_path, "0", settings=split(16, 1))
    make_point(
        tmp_path, "1", settings={"batch": {"global_size": None, "micro_size": 8, "grad_accum": 2}}
    )
    assert verdicts(tmp_path)[1] == ("0", Verdict.agrees)


def test_inexact_settings_are_shown_but_not_judged(tmp_path: Path) -> None:
    off = [x * 1.01 for x in CURVE]
    make_point(tmp_path, "0", settings=split(16, 1, model={"dropout": 0.1}))
    make_point(tmp_path, "1", settings=split(16, 2, model={"dropout": 0.1}), losses=off)
    make_point(tmp_path, "2", settings=split(16, 1, train={"precision": "bf16"}))
    make_point(tmp_path, "3", settings=split(16, 2, train={"precision": "bf16"}), losses=off)
    comparisons = compare_points(find_points(tmp_path))
    assert [c.verdict for c in comparisons] == [Verdict.reference, Verdict.unchecked] * 2
    assert comparisons[1].max_rel_diff == pytest.approx(0.01)
    assert "dropout" in comparisons[1].note and "bf16" in comparisons[3].note


def test_only_common_steps_are_compared() -> None:
    assert max_rel_diff({1: 2.0, 2: 1.0}, {1: 2.0, 2: 1.5, 3: 9.0}) == (2, pytest.approx(1 / 3))
    assert max_rel_diff({4: 1.0}, {1: 1.0}) == (0, None)
    assert max_rel_diff({1: 1.0, 2: 2.0, 3: 4.0}, {1: 1.0, 2: 2.0, 3: 2.0}, steps=2) == (2, 0.0)


def test_late_rounding_drift_is_shown_but_only_the_first_steps_are_judged(tmp_path: Path) -> None:
    reference = [5.0 - 0.1 * i for i in range(30)]
    drifted = [x * (1 + 1e-7) for x in reference[:15]] + [x * (1 + 5e-5) for x in reference[15:]]
    make_point(tmp_path, "0", settings=split(16, 1), losses=reference)
    make_point(tmp_path, "1", settings=split(16, 4), losses=drifted)
    points = find_points(tmp_path)
    first_ten = compare_points(points)[1]
    assert (first_ten.verdict, first_ten.common_steps) == (Verdict.agrees, 10)
    assert first_ten.max_rel_diff_all == pytest.approx(5e-5)
    assert compare_points(points, Check(steps=0))[1].verdict == Verdict.differs
    assert compare_points(points, Check(tolerance=1e-4, steps=0))[1].verdict == Verdict.agrees


def test_statuses_come_from_the_files_a_run_leaves(tmp_path: Path) -> None:
    make_point(tmp_path, "0", settings=split(16, 1))
    make_point(tmp_path, "1", settings=split(16, 2), finished=False)
    pending = split(16, 4)  # plan only: a SLURM job not started yet
    make_point(tmp_path, "2", settings=pending, losses=[], finished=False)
    make_point(
        tmp_path, "3", overrides=["batch.grad_accum=3"], error="batch.grad_accum: bad. Fix: 2"
    )
    make_point(tmp_path, "4", settings=split(16, 8), summary={"status": "stopped"})
    with open(tmp_path / "1" / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # a line cut short by a killed job
    points = find_points(tmp_path)
    assert [p.status for p in points] == [
        Status.ok,
        Status.incomplete,
        Status.planned,
        Status.failed,
        Status.stopped,
    ]
    headline = summarize(tmp_path).headline()
    assert headline.startswith("5 point(s): 1 ok, 1 failed, 1 stopped, 1 incomplete, 1 planned;")
    assert points[1].losses == dict(enumerate(CURVE, start=1))
    assert points[3].error == "batch.grad_accum: bad. Fix: 2"
    assert points[3].overrides == ["batch.grad_accum=3"]


def test_points_are_found_in_job_order_and_their_own_folders_are_not_searched(
    tmp_path: Path,
) -> None:
    for name in ("10", "9", "0"):
        make_point(tmp_path, name, settings=split(16, 1))
    # wandb keeps a config.yaml of its own inside a run directory: not a point.
    (tmp_path / "9" / "wandb" / "offline-run" / "files").mkdir(parents=True)
    (tmp_path / "9" / "wandb" / "offline-run" / "files" / "config.yaml").write_text("a: 1\n")
    make_point(tmp_path / "by_name", "lr=0.1", settings=split(16, 2))
    (tmp_path / ".hidden").mkdir()
    assert [p.name for p in find_points(tmp_path)] == ["0", "9", "10", "by_name/lr=0.1"]


def test_tokens_per_second_leaves_out_the_first_step_and_resists_a_slow_one(tmp_path: Path) -> None:
    run = make_point(tmp_path, "0", settings=split(16, 1), step_times=[9.0, 0.5, 5.0, 0.5])
    assert read_point(run, "0").steady_tokens_per_s == pytest.approx(200.0)
    short = make_point(tmp_path, "1", settings=split(16, 1), losses=[5.0])
    assert read_point(short, "1").steady_tokens_per_s == 123.0  # summary.json's figure


def test_labels_name_the_overrides_that_vary(tmp_path: Path) -> None:
    common = ["batch.global_size=16", "train.steps=4"]
    make_point(
        tmp_path,
        "0",
        settings=split(16, 1),
        overrides=[*common, "batch.grad_accum=1", "ac.policy=none"],
    )
    make_point(
        tmp_path,
        "1",
        settings=split(16, 2),
        overrides=[*common, "batch.grad_accum=2", "ac.policy=full"],
    )
    make_point(tmp_path, "2", settings=split(16, 4))  # ran outside Hydra: labelled by its split
    rows = summarize(tmp_path).rows
    assert [r["label"] for r in rows] == [
        "grad_accum=1 ac.policy=none",
        "grad_accum=2 ac.policy=full",
        "dp1 x 4 x 4 none",
    ]


def test_summary_files_leave_missing_activation_figures_blank(tmp_path: Path) -> None:
    make_point(
        tmp_path,
        "0",
        settings=split(16, 1),
        summary={"activation_bytes": 5 * 2**20, "activation_peak_bytes": 6 * 2**20},
    )
    make_point(tmp_path, "1", settings=split(16, 2))
    make_point(
        tmp_path,
        "2",
        overrides=["batch.grad_accum=3"],
        error="batch.grad_accum: not a divisor. Fix: use 2",
    )
    result = write_summary(tmp_path)
    assert not result.passed  # one point failed
    with open(tmp_path / "sweep_summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["activation_bytes"] for r in rows] == [str(5 * 2**20), "", ""]
    assert rows[1]["activation_peak_bytes"] == "" and rows[1]["check"] == "agrees"
    assert rows[2]["status"] == "failed" and rows[2]["note"].startswith(
        "batch.grad_accum: not a divisor"
    )
    markdown = (tmp_path / "sweep_summary.md").read_text()
    assert "| 5.0 MiB | 6.0 MiB |" in markdown
    assert "3 point(s): 2 ok, 1 failed" in markdown
    assert (tmp_path / "sweep_summary.png").read_bytes()[:4] == b"\x89PNG"


def test_an_empty_or_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LauncherError, match="no run directory"):
        summarize(tmp_path)
    with pytest.raises(LauncherError, match="does not exist"):
        summarize(tmp_path / "nowhere")
