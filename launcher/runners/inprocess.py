"""One rank on this machine, inside the `launch` process itself (fast start, no subprocess)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from launcher.config.root import RootConfig
from launcher.runners.local import LocalRunner, thread_environment

if TYPE_CHECKING:
    from launcher.plan import Plan


class InProcessRunner(LocalRunner):
    name = "in-process"

    def environment(self, cfg: RootConfig) -> dict[str, str]:
        """The thread cap torchrun's ranks get (OMP_NUM_THREADS), applied here with
        torch.set_num_threads: torch read the environment when `launch` imported it."""
        return thread_environment(cfg)

    def run(self, cfg: RootConfig, run_dir: Path, plan: Plan) -> int:
        from importlib import import_module

        import torch

        from launcher.runners.rank_fork import trained_here

        trained_here()  # ranks this process starts later (a sweep's next point) are exec'd
        # launcher.worker.run builds the model, the engine: torch-heavy, imported here.
        worker = "launcher.worker.run" if self.worker == "launcher.worker" else self.worker
        run_in_process = import_module(worker).run_in_process
        threads = plan.env.get("OMP_NUM_THREADS")
        before = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(int(threads))
        try:
            return run_in_process(cfg, run_dir)
        finally:
            torch.set_num_threads(before)
