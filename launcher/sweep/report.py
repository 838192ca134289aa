"""Write a sweep's summary files: the CSV table, the Markdown report and the loss-curve plot."""

from __future__ import annotations

from pathlib import Path

from launcher.rundir import SWEEP_CSV, SWEEP_MD, SWEEP_PNG
from launcher.sweep.compare import Check
from launcher.sweep.plot import plot_summary
from launcher.sweep.summary import COLUMNS, SweepSummary, summarize
from launcher.sweep.table import render_markdown, write_csv


def write_summary(sweep_dir: Path, check: Check | None = None) -> SweepSummary:
    """Write sweep_summary.csv, sweep_summary.md and sweep_summary.png into the sweep directory."""
    result = summarize(sweep_dir, check)
    write_csv(result.rows, COLUMNS, sweep_dir / SWEEP_CSV)
    (sweep_dir / SWEEP_MD).write_text(render_markdown(result), encoding="utf-8")
    plot_summary(result, sweep_dir / SWEEP_PNG)
    return result
