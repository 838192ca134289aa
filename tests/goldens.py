"""The reviewed golden files in tests/golden/ (ds_config.json per ZeRO stage, train.sbatch per
cluster case): what the code renders for each, and the one way to rewrite them.

    .venv/bin/python -m tests.goldens            # show what differs (exit status 1 if any)
    .venv/bin/python -m tests.goldens --write    # rewrite them, after reviewing that diff

The tests (tests/unit/test_ds_config.py, tests/unit/test_sbatch_render.py) only compare; no
environment variable makes them write. The contract snapshots have their own command
(python -m tests.e2e.contract_snapshot --write).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from launcher.config import to_root_config
from launcher.config.root import RootConfig
from launcher.config.store import register_configs

TESTS = Path(__file__).resolve().parent
CONF = TESTS.parent / "conf"
GOLDEN = TESTS / "golden"
WRITE = "python -m tests.goldens --write"

# ds_config: the split the goldens are written for: 16 sequences = dp 2 x grad_accum 2 x micro 4.
GOLDEN_OVERRIDES = ["parallel.dp=2", "batch.global_size=16", "batch.micro_size=4"]
ZERO_STAGES = (0, 1, 2, 3)

# train.sbatch: a run directory and interpreter that need not exist here.
RUN_DIR = Path("/scratch/runs/demo")
PYTHON = "/opt/venvs/train/bin/python"
SBATCH_CASES: dict[str, dict[str, Any]] = {
    "1node_cpu": {
        "cluster": {"name": "slurm", "python": PYTHON},
        "parallel": {"dp": 2, "nodes": 1},
    },
    "2node_gpu": {
        "cluster": {
            "name": "slurm",
            "python": PYTHON,
            "job_name": "gpt2-124m",
            "partition": "gpu",
            "account": "proj42",
            "qos": "high",
            "constraint": "a100&ib",
            "time": "1-12:00:00",
            "gpus_per_node": 4,
            "cpus_per_task": 32,
            "mem": "256G",
            "signal_seconds": 300,
            "max_requeues": 5,
            "port": 29611,
            "extra_directives": ["--exclusive", "--mail-type=END,FAIL"],
            "setup": ["module load cuda/12.4", "source /opt/venvs/train/bin/activate"],
        },
        "parallel": {"dp": 8, "nodes": 2},
        "train": {"device": "cuda"},
    },
}


def compose_config(overrides: list[str]) -> RootConfig:
    """What `launch` composes from conf/ for these overrides."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return to_root_config(compose(config_name="config", overrides=overrides))


def ds_config_text(stage: int) -> str:
    from launcher.engines.ds_config import ds_config_json

    overrides = ["engine=deepspeed", f"engine.zero_stage={stage}", *GOLDEN_OVERRIDES]
    return ds_config_json(compose_config(overrides))


def sbatch_text(case: str) -> str:
    from launcher.runners.slurm import render_sbatch

    return render_sbatch(to_root_config(SBATCH_CASES[case]), RUN_DIR)


def ds_config_golden(stage: int) -> Path:
    return GOLDEN / f"ds_config_stage{stage}.json"


def sbatch_golden(case: str) -> Path:
    return GOLDEN / f"sbatch_{case}.sbatch"


def renderers() -> dict[Path, Callable[[], str]]:
    """Every golden file and what renders it now."""
    out: dict[Path, Callable[[], str]] = {}
    for stage in ZERO_STAGES:
        out[ds_config_golden(stage)] = lambda stage=stage: ds_config_text(stage)
    for case in sorted(SBATCH_CASES):
        out[sbatch_golden(case)] = lambda case=case: sbatch_text(case)
    return out


def changed_message(path: Path, text: str) -> str:
    """The failure a test shows: the diff (golden -> now) and the command that accepts it."""
    old = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.exists() else []
    diff = "".join(
        difflib.unified_diff(old, text.splitlines(keepends=True), f"{path.name} (golden)", "now")
    )
    return f"{path.name} differs from what the code renders:\n{diff}\nIf intended: {WRITE}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the goldens that differ")
    args = parser.parse_args(argv)
    differ = 0
    for path, render in renderers().items():
        text = render()
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        differ += 1
        if args.write:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(TESTS.parent)}")
        else:
            print(changed_message(path, text))
    if not differ:
        print("every golden matches the code")
    return 1 if differ and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
