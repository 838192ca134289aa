"""What rank 0 says on the first stop signal: inside a SLURM step a SIGTERM is SLURM's own (a
cancel, a preemption, the time limit, or a failed node: train.sbatch relays its stops as SIGUSR1),
so it never promises a checkpoint or asks for another SIGTERM."""

from __future__ import annotations

import signal

import pytest

from launcher.worker.stop import CTRL_C_STOPPING, SLURM_STEP_ENV, SLURM_TERM, stopping_message


def test_a_sigterm_in_a_slurm_step_names_a_node_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLURM_STEP_ENV, "0")
    said = stopping_message(signal.SIGTERM)
    assert said == SLURM_TERM and "one of its nodes failed" in said
    assert "if every rank gets there" in said and "send SIGTERM again" not in said
    # train.sbatch's own relay (the time-limit notice, a TERM to the batch script) asks as before.
    assert stopping_message(signal.SIGUSR1).startswith("SIGUSR1: stopping after the current")


def test_outside_slurm_a_sigterm_asks_for_a_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SLURM_STEP_ENV, raising=False)
    said = stopping_message(signal.SIGTERM)
    assert said.startswith("SIGTERM: stopping after the current optimizer step")
    assert "send SIGTERM again to stop at once" in said
    assert stopping_message(signal.SIGINT) == CTRL_C_STOPPING
