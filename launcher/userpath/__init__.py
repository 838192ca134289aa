"""The one writer of every path a user names, and of the launcher's own files inside a directory
the user named; docs/development.md ("Files the user names") states both rules.

- check.py: what a path the user names is, refused before the slow part when it cannot be written;
- named.py: a file the user names (`--output FILE`, the sweep summaries) is replaced through a
  hidden temporary file of its own, a link written through as a shell's `>` would;
- own.py: a file of the launcher's own in a run directory or cache (config.yaml, metrics.jsonl,
  a lock) is never opened through a link: a link there is one error naming the path and the fix.
"""

from launcher.userpath.check import TEMP_INFIX, OutputTarget, Way, check_output_file, descriptor_of
from launcher.userpath.named import new_file_mode, open_output, write_failed, write_output
from launcher.userpath.own import RUN_DIR_KEY, open_own, refuse_link, replace_own

__all__ = [
    "RUN_DIR_KEY",
    "TEMP_INFIX",
    "OutputTarget",
    "Way",
    "check_output_file",
    "descriptor_of",
    "new_file_mode",
    "open_output",
    "open_own",
    "refuse_link",
    "replace_own",
    "write_failed",
    "write_output",
]
