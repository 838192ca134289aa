"""Write a sweep's summary files: the CSV table, the Markdown report and the loss-curve plot.

They go into the sweep directory the user named, by launcher/userpath's rule (each replaced
whole when complete, its permission bits kept, a link written through, nothing else touched)."""

from __future__ import annotations

from pathlib import Path

from launcher.rundir import SWEEP_CSV, SWEEP_MD, SWEEP_PNG
from launcher.sweep.compare import Check
from launcher.sweep.plot import plot_summary
from launcher.sweep.summary import COLUMNS, SweepSummary, summarize
from launcher.sweep.table import render_markdown, write_csv
from launcher.userpath import check_output_file, open_output, write_output


def write_summary(
    sweep_dir: Path, check: Check | None = None, key: str = "SWEEP_DIR"
) -> SweepSummary:
    """Write sweep_summary.csv, sweep_summary.md and sweep_summary.png into the sweep directory;
    `key` names the directory in an error (the argument, or hydra.sweep.dir)."""
    result = summarize(sweep_dir, check)
    csv_path, md_path, png_path = (sweep_dir / name for name in (SWEEP_CSV, SWEEP_MD, SWEEP_PNG))
    for path in (csv_path, md_path, png_path):  # all three can be written, before any is
        check_output_file(path, key)
    with open_output(csv_path, key, newline="") as out:
        write_csv(result.rows, COLUMNS, out)
    write_output(md_path, key, render_markdown(result))
    with open_output(png_path, key, binary=True) as out:
        plot_summary(result, out)
    return result
