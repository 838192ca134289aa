"""What checkpoint.keep's pruning does with a checkpoint an evaluation has not read yet.

eval.harness.every marks each checkpoint it evaluates with eval/step_N.pending until the
evaluation has read it (launcher/harness/dispatch.py). Past checkpoint.keep such a checkpoint is
kept, and the log says so once, naming the evaluation; but at most checkpoint.keep of them (the
newest): an older one is pruned all the same, its marker removed, with a warning naming the
evaluation that will not find it. So a queued evaluation job that never runs, or a marker left
behind, holds at most checkpoint.keep checkpoints beyond checkpoint.keep, never the disk.
"""

from __future__ import annotations

from pathlib import Path

from launcher.logs import get_logger
from launcher.rundir import PENDING_SUFFIX, harness_file

log = get_logger("checkpoint")


def past_keep(run_dir: Path, stale: list[tuple[int, Path]], keep: int) -> list[Path]:
    """The checkpoints to remove of `stale` (those past checkpoint.keep, newest first); those an
    evaluation waits for are kept, at most `keep` of them, and each one kept or released is
    named in the log."""
    remove: list[Path] = []
    held = 0
    for index, (step, path) in enumerate(stale):
        marker = harness_file(run_dir, step, PENDING_SUFFIX)
        if not marker.exists():
            remove.append(path)
        elif held < keep:
            held += 1
            if index == 0:  # it just left checkpoint.keep's window: said once
                log.warning(
                    f"keeping checkpoint {path} past checkpoint.keep={keep}: its evaluation has "
                    f"not read it yet ({marker}); at most {keep} such checkpoint(s) are kept."
                )
        else:
            marker.unlink(missing_ok=True)
            remove.append(path)
            log.warning(
                f"pruned checkpoint {path} before its evaluation read it ({marker}, removed): "
                f"checkpoint.keep={keep} keeps at most {keep} checkpoint(s) more for pending "
                "evaluations. Fix: raise checkpoint.keep, or eval.harness.every so that "
                "evaluations keep up."
            )
    return remove
