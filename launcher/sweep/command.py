"""`launch sweep-summary <sweep dir>`: the summary of a sweep whose points ran elsewhere (SLURM)."""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher.errors import LauncherError
from launcher.logs import get_logger, setup_logging
from launcher.sweep.compare import DEFAULT_STEPS, DEFAULT_TOLERANCE, Check

log = get_logger("sweep")

USAGE = "launch sweep-summary SWEEP_DIR [--tolerance X] [--steps N] [--jobs-ended]"


def summary_main(argv: list[str]) -> int:
    """Write the summary files; exit 0 when every point ran and agrees with its reference,
    1 when a point failed or trained a different model, 2 on a bad directory."""
    parser = argparse.ArgumentParser(
        prog="launch sweep-summary",
        usage=USAGE,
        description="Write sweep_summary.csv, .md and .png into a sweep directory (Hydra's "
        "hydra.sweep.dir): one row per run directory, each loss curve checked against the first "
        "point with the same global batch, seed and model.",
    )
    parser.add_argument(
        "sweep_dir", type=Path, help="the directory holding the points' run directories"
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"largest relative loss difference accepted (default {DEFAULT_TOLERANCE:g}, for fp32)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"compare the first N common steps, 0 for all (default {DEFAULT_STEPS}; later, "
        "fp32 rounding amplified by the optimizer can exceed the tolerance between correct splits)",
    )
    parser.add_argument(
        "--jobs-ended",
        action="store_true",
        help="every point's SLURM job has ended (what the summary job after a SLURM sweep "
        "passes): a point whose job left no result is recorded as failed, with the reason, in "
        "its error.txt",
    )
    args = parser.parse_args(argv)
    if args.tolerance <= 0 or args.steps < 0:
        parser.error("--tolerance must be positive and --steps non-negative")
    setup_logging(0)
    from launcher.rundir import SWEEP_MD
    from launcher.sweep.report import write_summary

    try:
        if args.jobs_ended:
            from launcher.sweep.after_jobs import record_ended_jobs

            for name in record_ended_jobs(args.sweep_dir):
                log.warning(f"point {name}: its SLURM job ended without finishing the run")
        result = write_summary(args.sweep_dir, Check(args.tolerance, args.steps))
    except LauncherError as exc:
        log.error(str(exc))
        return exc.exit_code
    print((args.sweep_dir / SWEEP_MD).read_text(encoding="utf-8"), end="")
    log.info(f"wrote {args.sweep_dir}/sweep_summary.md, .csv and .png")
    return 0 if result.passed else 1
