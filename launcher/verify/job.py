"""The verify steps a SLURM job runs on its batch host (launcher/runners/slurm_verify.py):

    python -m launcher.verify.job prepare RUN_DIR   the split's directory and config.yaml
    python -m launcher.verify.job certify RUN_DIR   the reference, the comparison, verify.json

Exit status: 0 done (certify: certified), 1 not certified or failed, 2 bad usage or config.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.config import load_config_file
from launcher.errors import LauncherError
from launcher.logs import get_logger, setup_logging
from launcher.rundir import CONFIG_FILE, SBATCH_FILE
from launcher.verify.results import SPLIT_DIR, VERIFY_DIR, clear_results
from launcher.verify.settings import split_config

USAGE = "usage: python -m launcher.verify.job prepare|certify RUN_DIR"


def prepare(run_dir: Path) -> int:
    """Write the split's config.yaml and plan.json (as `launch verify` does on one machine)."""
    from launcher.plan import build_plan
    from launcher.prepare import write_run_files
    from launcher.runners.slurm import SlurmRunner

    split_cfg = split_config(load_config_file(run_dir / CONFIG_FILE))
    out_dir = run_dir / VERIFY_DIR / SPLIT_DIR
    plan = build_plan(split_cfg, out_dir, SlurmRunner())
    plan.files.pop(SBATCH_FILE, None)  # the job running it is the run's own script
    write_run_files(plan.config or split_cfg, out_dir, plan)
    clear_results(out_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    setup_logging(0)
    if len(args) != 2 or args[0] not in ("prepare", "certify"):
        print(USAGE, file=sys.stderr)
        return 2
    run_dir = Path(args[1]).resolve()
    try:
        if args[0] == "prepare":
            return prepare(run_dir)
        from launcher.verify.command import certify

        return certify(load_config_file(run_dir / CONFIG_FILE), run_dir)
    except LauncherError as exc:
        get_logger("verify").error(str(exc))
        return exc.exit_code


if __name__ == "__main__":
    from launcher.lifetime import exit_now

    exit_now(main())
