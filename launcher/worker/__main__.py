"""Entry point of every rank under torchrun: `python -m launcher.worker <run dir>/config.yaml`."""

from __future__ import annotations

import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from launcher.config import load_config_file
from launcher.errors import LauncherError
from launcher.worker.run import run_in_process


@record
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m launcher.worker <run dir>/config.yaml", file=sys.stderr)
        return 2
    config_path = Path(args[0]).resolve()
    try:
        cfg = load_config_file(config_path)
        return run_in_process(cfg, config_path.parent)
    except LauncherError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
