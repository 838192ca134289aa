"""Two real gloo ranks: the token-exact loss across ranks and micro-batches, one gradient sync per
step, one small all-reduce of the loop's own per step (token counts, stop flag and the previous
step's loss together), and a step with no valid token skipped everywhere.

One spawned group does every test's work in turn (issue 43: one start of two ranks, not five),
each a fresh Trainer on the same process group; the tests read what it wrote."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from launcher.data import build_dataset
from launcher.data.sequence import IGNORE_INDEX, Sample
from launcher.training.loss import LossFn, per_micro_batch_mean, token_exact_loss
from tests.harness import (
    build_trainer,
    free_port,
    join_group,
    make_config,
    one_step_gradient,
    record_gradients,
    relative_error,
)
from tests.spawned import run_ranks

pytestmark = pytest.mark.multiproc
WORLD = 2


def _group(rank: int, port: int, out: str) -> None:
    """Every test's work, in turn, in one 2-rank gloo group, then the group torn down.

    Everything a work built (the DDP model above all) is released before the next one and before
    the group is destroyed: a DDP reducer that holds the last reference to a gloo group deadlocks
    in its destructor. A work that raises ends the group (mp.spawn stops the other rank, so it
    cannot wait alone in a collective); the tests of the works after it say they did not run.
    """
    ctx = join_group(rank, WORLD, port)
    try:
        for work, args in WORKS:
            try:
                work(ctx, rank, out, *args)
            finally:
                gc.collect()
    finally:
        gc.collect()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str | None]:
    """The directory the group wrote to, and why it failed (None when every work ran)."""
    out = tmp_path_factory.mktemp("dp_exact")
    try:
        run_ranks(_group, (free_port(), str(out)), WORLD)
    except Exception as exc:  # the test whose file is missing says why
        return out, repr(exc)
    return out, None


def _written(group: tuple[Path, str | None], name: str) -> Path:
    path = group[0] / name
    if not path.exists():
        pytest.fail(f"{name} was not written: {group[1]}")
    return path


SPLIT = {"parallel": {"dp": 2}, "batch": {"global_size": 12, "grad_accum": 3}}


def _gradient_work(ctx: Any, rank: int, out: str, loss_fn: LossFn) -> None:
    trainer = build_trainer(make_config(**SPLIT), ctx, Path(out), loss_fn=loss_fn)
    grads = record_gradients(trainer)
    trainer.train_step(0)
    torch.save(grads[0], Path(out) / f"grad_{loss_fn.__name__}_rank{rank}.pt")


def test_dp2_accum3_gradient_equals_single_process(
    group: tuple[Path, str | None], tmp_path: Path
) -> None:
    reference = one_step_gradient(make_config(batch={"global_size": 12}), tmp_path)
    for rank in range(WORLD):
        grad = torch.load(_written(group, f"grad_token_exact_loss_rank{rank}.pt"))
        assert relative_error(grad, reference) < 1e-5

    # Negative control on the same data: mean of per-micro-batch, per-rank means.
    wrong = torch.load(_written(group, "grad_per_micro_batch_mean_rank0.pt"))
    assert relative_error(wrong, reference) > 1e-3


def _count_work(ctx: Any, rank: int, out: str, accum: int) -> None:
    counts = {"gradient_allreduce": 0, "step_counts": 0, "loss_flush": 0}
    cfg = make_config(parallel={"dp": 2}, batch={"global_size": 16, "grad_accum": accum})
    trainer = build_trainer(cfg, ctx, Path(out))

    # No annotations: DDP checks them at runtime and this module postpones their evaluation.
    def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
        counts["gradient_allreduce"] += 1
        return allreduce_hook(state, bucket)

    trainer.engine.model.register_comm_hook(None, counting_hook)  # type: ignore[operator]
    real_counts = trainer.counts

    def counting_counts(*args: Any) -> Any:
        counts["step_counts"] += 1
        return real_counts(*args)

    trainer.counts = counting_counts  # this trainer's own collective, counted
    for _ in range(3):
        trainer.advance()
    per_step = dict(counts)
    real_reduce = trainer.reduce_loss

    def counting_reduce(*args: Any) -> Any:
        counts["loss_flush"] += 1
        return real_reduce(*args)

    trainer.reduce_loss = counting_reduce
    trainer.flush()  # the last step's loss has no next step to ride on
    logged = trainer.tracker.totals
    if rank == 0:
        record = {**per_step, "loss_flush": counts["loss_flush"], "logged": logged.steps}
        (Path(out) / f"counts_accum{accum}.json").write_text(json.dumps(record))


def test_one_gradient_sync_and_one_small_all_reduce_per_step(
    group: tuple[Path, str | None],
) -> None:
    one = json.loads(_written(group, "counts_accum1.json").read_text())
    four = json.loads(_written(group, "counts_accum4.json").read_text())
    assert one["gradient_allreduce"] == four["gradient_allreduce"] > 0
    # Counts, stop flag and the previous step's loss: one collective per step, 3 steps...
    assert one["step_counts"] == four["step_counts"] == 3
    # ...and the last step's loss, reduced alone when it is flushed.
    assert one["loss_flush"] == four["loss_flush"] == 1
    assert one["logged"] == four["logged"] == 3


class _EmptyStepDataset:
    """The reverse task, except that every sample of step 1 has no valid target."""

    def __init__(self, inner: Any, global_size: int) -> None:
        self.inner, self.global_size = inner, global_size

    def __len__(self) -> int:
        return 0

    def __getitem__(self, index: int) -> Sample:
        sample = self.inner[index]
        if index // self.global_size == 1:
            return Sample(sample.input_ids, torch.full_like(sample.targets, IGNORE_INDEX))
        return sample

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []


def _empty_step_work(ctx: Any, rank: int, out: str) -> None:
    cfg = make_config(parallel={"dp": 2}, batch={"global_size": 8, "grad_accum": 2})
    data = _EmptyStepDataset(build_dataset(cfg.data, cfg.model.seq_len, 0), 8)
    trainer = build_trainer(cfg, ctx, Path(out), dataset=data)
    steps, unchanged = [], []
    previous = None
    for step in range(3):
        before = [p.detach().clone() for p in trainer.engine.module.parameters()]
        previous = trainer.train_step(step, carry=previous)  # its loss rides on the next step
        steps.append(previous)
        after = trainer.engine.module.parameters()
        unchanged.append(all(torch.equal(a, p) for a, p in zip(before, after, strict=True)))
    trainer.pending = previous
    trainer.flush()  # the last step's loss
    results = [
        {"loss": r.loss, "tokens": r.tokens.total, "unchanged": same}
        for r, same in zip(steps, unchanged, strict=True)
    ]
    (Path(out) / f"empty_rank{rank}.json").write_text(json.dumps(results))


WORKS: list[tuple[Any, tuple[Any, ...]]] = [
    (_gradient_work, (token_exact_loss,)),
    (_gradient_work, (per_micro_batch_mean,)),
    (_count_work, (1,)),
    (_count_work, (4,)),
    (_empty_step_work, ()),
]
"""What the one group does, in this order (see _group)."""


def test_step_without_valid_tokens_is_skipped_on_every_rank(group: tuple[Path, str | None]) -> None:
    for rank in range(WORLD):
        results = json.loads(_written(group, f"empty_rank{rank}.json").read_text())
        assert results[1] == {"loss": None, "tokens": 0, "unchanged": True}
        for r in (results[0], results[2]):
            assert r["loss"] is not None and r["loss"] == r["loss"] and not r["unchanged"]
