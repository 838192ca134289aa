"""One rank on this machine, inside the `launch` process itself (fast start, no subprocess)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from launcher.config.root import RootConfig
from launcher.runners.local import LocalRunner

if TYPE_CHECKING:
    from launcher.plan import Plan


class InProcessRunner(LocalRunner):
    name = "in-process"

    def run(self, cfg: RootConfig, run_dir: Path, plan: Plan) -> int:
        del plan  # no command, no environment, no files of its own
        from launcher.worker.run import run_in_process  # builds the model, the engine: torch-heavy

        return run_in_process(cfg, run_dir)
