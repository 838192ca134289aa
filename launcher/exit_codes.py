"""Exit statuses that mean something to the launcher, SLURM scripts and users."""

OK = 0
FAILED = 1
CONFIG_ERROR = 2
"""A bad config, data file or environment: nothing was launched."""
STOPPED_RESUMABLE = 75
"""Stopped on a signal after saving a checkpoint; run the same command again to resume (EX_TEMPFAIL)."""
