"""Console progress, metrics.jsonl lines and the summary fields the tracker adds."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest

from launcher.rundir import METRICS_FILE, SUMMARY_FILE
from launcher.tracking.flops import MfuMeter
from launcher.tracking.metrics import StepMetrics
from launcher.tracking.summary import RunShape, RunSummary, StoppedRun
from launcher.tracking.tracker import METRIC_KEYS, Progress, Tracker

README = Path(__file__).resolve().parents[2] / "README.md"
CONTROL = re.compile(r"[\r\x1b\x08]")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def loop_metrics(step: int, seconds: float = 0.5, **changes: object) -> StepMetrics:
    """What the training loop hands the tracker for one step."""
    values: dict[str, object] = {
        "step": step,
        "loss": 2.0 / step,
        "tokens": 300,
        "lr": 1e-3,
        "grad_norm": 0.5,
        "step_time_s": seconds,
        "comm_wait_s": 0.05,
        "data_s": 0.05,
        "rank_tokens_min": 140,
        "rank_tokens_max": 160,
        "padding_fraction": 0.25,
        **changes,
    }
    return StepMetrics(**values)  # type: ignore[arg-type]


def test_plain_lines_every_n_steps_without_control_characters() -> None:
    out = io.StringIO()
    progress = Progress(total=10, every=4, stream=out)
    for step in range(1, 11):
        progress.update(step, 1.0, 1000.0, mfu=0.25, memory=2**30)
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/10", "4/10", "8/10", "10/10"]
    assert "mfu 25.0%" in lines[0] and "mem 1.00 GiB" in lines[0] and "eta" in lines[0]
    assert not CONTROL.search(out.getvalue())


def test_terminal_gets_a_redrawn_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    out = Terminal()
    progress = Progress(total=3, every=100, stream=out)
    for step in range(1, 4):
        progress.update(step, None if step == 2 else 1.0, 1000.0)
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n")
    assert "step 2/3 loss skipped" in text


def test_dumb_terminal_gets_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    out = Terminal()
    Progress(total=2, every=1, stream=out).update(1, 1.0, 10.0)
    assert not CONTROL.search(out.getvalue())


def make_tracker(run_dir: Path, enabled: bool = True, recompute: bool = False) -> Tracker:
    return Tracker(
        run_dir,
        total_steps=4,
        log_every=2,
        enabled=enabled,
        positions_per_step=400,
        meter=MfuMeter(flops_per_token=1_000_000, peak_per_device=1e9, devices=2),
        recompute=recompute,
        stream=io.StringIO(),
    )


SHAPE = RunShape(
    world_size=2, dp=2, micro_size=4, grad_accum=2, global_size=16, engine="ddp", ac="full"
)
SUMMARY_KEYS = [
    "steps",
    "final_loss",
    "final_val_loss",
    "tokens",
    "tokens_per_s",
    "train_seconds",
    "compile_s",
    "peak_memory_bytes",
    "planned_peak_bytes",
    "peak_rss_bytes",
    "world_size",
    "dp",
    "tp",
    "pp",
    "micro_size",
    "grad_accum",
    "global_size",
    "engine",
    "ac",
    "eval_accuracy",
    "status",
    "resumed_from_step",
    "activation_bytes",
    "activation_peak_bytes",
    "recompute_flops_ratio",
    "mfu",
    "hfu",
    "flops_per_token",
    "peak_flops",
    "device",
    "compute_s",
    "comm_wait_s",
    "data_s",
    "padding_fraction",
    "rank_tokens_min",
    "rank_tokens_max",
    "wandb_run_id",
]
"""summary.json of a CPU run, in the order written (as before the summary became a dataclass)."""
ACTIVATIONS = {"activation_bytes": 10, "activation_peak_bytes": 20, "recompute_flops_ratio": 1.25}


def finish(tracker: Tracker, **activations: object) -> dict[str, object]:
    summary = tracker.summary(
        SHAPE,
        peak_memory=1,
        eval_accuracy=None,
        resumed_from_step=None,
        activations=activations,
    )
    return tracker.finish(summary)


def test_every_line_carries_every_key(tmp_path: Path) -> None:
    tracker = make_tracker(tmp_path)
    tracker.log_step(loop_metrics(1))
    tracker.log_step(loop_metrics(2, loss=None, grad_norm=math.nan))
    finish(tracker)
    lines = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:
        assert list(line) == list(METRIC_KEYS)
        assert line["peak_rss_bytes"] > 0
        assert line["peak_memory_bytes"] is None  # CPU: no tensor peak measured by this tracker
    # 400 positions x 1e6 FLOPs in 0.5 s over 2 x 1e9 FLOP/s = 0.4
    assert lines[0]["mfu"] == pytest.approx(0.4)
    assert lines[0]["tokens_per_s"] == 600 and lines[0]["compute_s"] == pytest.approx(0.4)
    assert lines[0]["skipped"] is False and lines[1]["skipped"] is True
    assert lines[1]["loss"] is None and lines[1]["grad_norm"] is None  # NaN is written as null


def test_summary_fields(tmp_path: Path) -> None:
    tracker = make_tracker(tmp_path, recompute=True)
    for step in (1, 2):
        tracker.log_step(loop_metrics(step, rank_tokens_min=100 + step, rank_tokens_max=200 + step))
    summary = finish(tracker, **ACTIVATIONS)
    assert summary == json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert list(summary) == SUMMARY_KEYS
    assert summary["steps"] == 2 and summary["final_loss"] == 1.0 and summary["tokens"] == 600
    assert summary["tokens_per_s"] == 600 and summary["train_seconds"] == 1.0
    assert summary["mfu"] == pytest.approx(0.4)
    assert summary["hfu"] == pytest.approx(0.5)
    assert summary["flops_per_token"] == 1_000_000 and summary["peak_flops"] == 1e9
    assert summary["comm_wait_s"] == pytest.approx(0.1)
    assert summary["compute_s"] == pytest.approx(1.0 - 0.1 - 0.1)
    assert summary["data_s"] == pytest.approx(0.1)
    assert summary["padding_fraction"] == pytest.approx(1 - 600 / 800)
    assert (summary["rank_tokens_min"], summary["rank_tokens_max"]) == (101, 202)
    assert summary["wandb_run_id"] is None and summary["status"] == "completed"


def test_the_summary_knows_its_exit_status() -> None:
    assert StoppedRun(steps=3).exit_status == 75
    assert RunSummary.__dataclass_fields__["status"].default == "completed"


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    tracker = make_tracker(tmp_path, enabled=False)
    tracker.log_step(loop_metrics(1))
    summary = finish(tracker)
    assert list(tmp_path.iterdir()) == []
    assert tracker.totals.steps == 1 and summary["steps"] == 1


def test_readme_documents_every_key() -> None:
    text = README.read_text()
    section = text[text.index("<!-- section: tracking -->") :]
    section = section[: section.index("<!-- section:", 10)]
    missing = [
        key for key in (*METRIC_KEYS, "hfu", "recompute_flops_ratio") if f"`{key}`" not in section
    ]
    assert not missing, f"README's tracking section does not document {missing}"


def test_rewind_keeps_each_step_once(tmp_path: Path) -> None:
    """A crash after step 12 with a checkpoint at step 10: the resumed run redoes 11-12. Found
    by the new-user probe: metrics.jsonl read 10, 11, 12, 11, 12, 13, ..."""
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in range(1, 13)]
    (tmp_path / METRICS_FILE).write_text("\n".join(lines) + '\n{"step": 13, "lo')  # cut short
    tracker = Tracker(tmp_path, total_steps=20, log_every=1, enabled=True)
    tracker.rewind(10)
    tracker.close(0)
    steps = [json.loads(ln)["step"] for ln in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert steps == list(range(1, 11))
