"""Exit statuses that mean something to the launcher, SLURM scripts and users."""

OK = 0
FAILED = 1
CONFIG_ERROR = 2
"""A bad config, data file or environment: nothing was launched."""
DIVERGED = 3
"""The loss became NaN or infinite: training stopped, nothing of that state was saved."""
STOPPED_RESUMABLE = 75
"""Stopped on a signal after saving a checkpoint; run the same command again to resume
(EX_TEMPFAIL)."""
ABORTED = 130
"""Aborted by a second Ctrl-C (128 + SIGINT): no checkpoint at the stop; a rerun resumes from the
last complete one."""
HUNG = 76
"""A rank made no progress for train.hang_timeout seconds (hang_report.txt names it, with the
ranks' stacks) and no torchrun restart was left; a rerun resumes from the last complete checkpoint
(or starts over when none was saved).
Also a rank that held the job at its end (after another rank exited cleanly) when the run's work
was not complete and saved."""
COMPLETE_HELD = 77
"""The run's work is complete and saved (metrics.jsonl holding every step, the final checkpoint in
place unless checkpoint.enabled=false), but a rank held the job at its end: still running
train.hang_timeout seconds after another rank had exited cleanly (wedged in an evaluation, a
tracker's upload, the process group's teardown; the launcher ended it and hang_report.txt names it
with its stack), or it died past its training. Nothing to rerun."""
