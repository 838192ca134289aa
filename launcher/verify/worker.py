"""Entry point of `launch verify`'s ranks: `python -m launcher.verify.worker <dir>/config.yaml`.

The runners start it in place of `launcher.worker` (Runner.worker); the directory is the split's
own (<run dir>/verify/split), where rank 0 writes what the comparison reads. Light at import,
like launcher.worker: the rank ties its life to torchrun's agent before torch is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.config.root import RootConfig

WORKER = "launcher.verify.worker"


def run_in_process(cfg: RootConfig, run_dir: Path) -> int:
    """Run this process as one rank of the verified split (or as its only rank); exit status."""
    from launcher.verify.rank import run_verify_rank

    return run_verify_rank(cfg, run_dir)


if __name__ == "__main__":
    from launcher.lifetime import exit_now
    from launcher.worker.__main__ import main

    exit_now(main(worker=WORKER))
