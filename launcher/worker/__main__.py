"""Entry point of every rank under torchrun: `python -m launcher.worker <run dir>/config.yaml`.

First, before the heavy imports, the rank ties its life to torchrun's agent (in `launch`, or
`launcher.runners.slurm_node` on a SLURM node): the kernel kills it when the agent dies, so a
kill -9 of `launch` never leaves ranks training on.
"""

from __future__ import annotations

import os
import sys


def _die_with_agent() -> None:
    from launcher.lifetime import AGENT_PID_ENV, die_with_parent

    agent = os.environ.get(AGENT_PID_ENV, "")
    die_with_parent(parent=int(agent) if agent.isdigit() else None)


def main(argv: list[str] | None = None, worker: str = "launcher.worker") -> int:
    """worker: the module whose `run_in_process(cfg, run_dir)` each rank runs (launcher.worker:
    training; launcher.verify.worker: `launch verify`'s ranks)."""
    from launcher.logs import mark

    mark("started")
    _die_with_agent()
    from torch.distributed.elastic.multiprocessing.errors import record

    code = record(_main)(argv, worker)  # a failure's traceback also goes to torchrun's error file
    return 1 if code is None else code


def _main(argv: list[str] | None, worker: str = "launcher.worker") -> int:
    from importlib import import_module
    from pathlib import Path

    from launcher.config import load_config_file
    from launcher.errors import LauncherError
    from launcher.logs import mark

    run_in_process = import_module(
        "launcher.worker.run" if worker == "launcher.worker" else worker
    ).run_in_process
    mark("imported")
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {worker} <run dir>/config.yaml", file=sys.stderr)
        return 2
    config_path = Path(args[0]).resolve()
    try:
        cfg = load_config_file(config_path)
        return run_in_process(cfg, config_path.parent)
    except LauncherError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        # The traceback is in error_rank<r>.txt already (several ranks), and `launch` names the
        # rank that failed first: one line here instead of a traceback per rank on the console.
        from launcher.rundir import rank_error_file

        rank = int(os.environ.get("RANK", "0"))
        where = rank_error_file(config_path.parent, rank)
        if int(os.environ.get("WORLD_SIZE", "1")) == 1 or not where.exists():
            raise
        print(f"rank {rank}: {type(exc).__name__}: {exc} (traceback: {where})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    from launcher.lifetime import exit_now

    exit_now(main())
