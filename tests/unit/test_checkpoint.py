"""Checkpoints in one process: exact resume, atomic layout, damaged ones skipped, fingerprints,
and loading that never runs code from the files."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from logging.handlers import BufferingHandler
from pathlib import Path

import pytest
import torch

from launcher.checkpoint.checkpointer import Checkpointer
from launcher.checkpoint.compat import check_compatible, fingerprint
from launcher.checkpoint.files import MARKER, find_checkpoints
from launcher.checkpoint.preflight import check_resume, start_fresh
from launcher.config.root import RootConfig
from launcher.distributed import DistContext, init_distributed, teardown_distributed
from launcher.engines.dcp import SafeReader
from launcher.errors import ConfigError
from launcher.training.loop import Trainer
from launcher.training.loss import all_reduce_token_counts
from tests.harness import build_trainer, make_config


@contextmanager
def one_rank() -> Iterator[DistContext]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: extra threads only wait on each other on a busy machine
    context = init_distributed("cpu")  # a one-rank gloo group in this process
    try:
        yield context
    finally:
        teardown_distributed()
        torch.set_num_threads(threads)


@pytest.fixture
def ctx() -> Iterator[DistContext]:
    with one_rank() as context:
        yield context


@pytest.fixture
def warnings_seen() -> Iterator[list[str]]:
    """Warnings of the launcher's loggers (they may not propagate to pytest's capture)."""
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("launcher")
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


def config(**sections: dict) -> RootConfig:
    base: dict = {
        "train": {"steps": 4},
        "batch": {"global_size": 8, "micro_size": 4},
        "checkpoint": {"every": 2},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return make_config(**base)


def train(trainer: Trainer, checkpoints: Checkpointer, steps: int) -> list[float]:
    """What Trainer.train does, returning the losses."""
    losses = []
    for _ in range(steps):
        result = trainer.train_step(trainer.step)
        trainer.step += 1
        trainer.tracker.log_step(result.metrics(trainer.split))
        checkpoints.after_step(trainer.step)
        assert result.loss is not None
        losses.append(result.loss)
    return losses


def run(cfg: RootConfig, ctx: DistContext, run_dir: Path) -> list[float]:
    trainer = build_trainer(cfg, ctx, run_dir)
    checkpoints = Checkpointer(cfg, run_dir, ctx, trainer)
    losses = train(trainer, checkpoints, cfg.train.steps)
    checkpoints.save_final()
    return losses


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """run(config()) once for the module: checkpoints at steps 2 and 4 (built before a test's
    own ctx: a module fixture is set up first)."""
    run_dir = tmp_path_factory.mktemp("four_steps")
    with one_rank() as context:
        run(config(), context, run_dir)
    return run_dir


@pytest.fixture
def four_step_run(four_steps: Path, tmp_path: Path) -> Path:
    """A copy of the module's 4-step run in tmp_path, for a test to change."""
    shutil.copytree(four_steps, tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_resume_continues_the_same_trajectory_bitwise(ctx: DistContext, tmp_path: Path) -> None:
    # Dropout on: the restored RNG state matters too.
    cfg = config(train={"steps": 6}, checkpoint={"every": 3}, model={"dropout": 0.1})
    straight = run(cfg, ctx, tmp_path)

    resumed_cfg = config(
        train={"steps": 6, "resume": str(tmp_path / "checkpoints" / "step_3")},
        model={"dropout": 0.1},
    )
    trainer = build_trainer(resumed_cfg, ctx, tmp_path)
    checkpoints = Checkpointer(resumed_cfg, tmp_path, ctx, trainer)
    resumed = checkpoints.resume()  # the state to continue from; the trainer is not touched
    assert resumed is not None and resumed.step == 3 and trainer.step == 0
    assert resumed.totals.steps == 3  # the run's totals so far come back too
    trainer.continue_from(resumed.step, resumed.totals)
    assert train(trainer, checkpoints, 3) == straight[3:]
    assert trainer.tracker.totals.steps == 6


def test_layout_marker_and_keep(ctx: DistContext, tmp_path: Path) -> None:
    run(config(checkpoint={"every": 1, "keep": 2}), ctx, tmp_path)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_3", "step_4"]  # no leftovers either
    newest = root / "step_4"
    files = json.loads((newest / MARKER).read_text())["files"]
    assert {"meta.json", "rng/rank_0.pt", "engine/.metadata"} <= set(files)
    assert all((newest / rel).stat().st_size == size for rel, size in files.items())
    meta = json.loads((newest / "meta.json").read_text())
    assert meta["step"] == 4 and meta["samples_seen"] == 32 and meta["world_size"] == 1
    assert [c.step for c in find_checkpoints(tmp_path)] == [4, 3]


def test_truncated_file_is_skipped_with_a_warning(
    four_step_run: Path, warnings_seen: list[str]
) -> None:
    tmp_path = four_step_run
    shard = max(
        (tmp_path / "checkpoints" / "step_4" / "engine").glob("*.distcp"),
        key=lambda p: p.stat().st_size,
    )
    os.truncate(shard, shard.stat().st_size // 2)
    assert [c.step for c in find_checkpoints(tmp_path)] == [2]
    assert any("step_4" in w and "truncated" in w for w in warnings_seen), warnings_seen


def test_interrupted_saves_are_skipped_with_a_warning(
    four_step_run: Path, warnings_seen: list[str]
) -> None:
    tmp_path = four_step_run
    root = tmp_path / "checkpoints"
    (root / ".tmp_step_6" / "engine").mkdir(parents=True)  # killed before its marker
    (root / "step_5").mkdir()  # not ours to trust: no marker
    assert [c.step for c in find_checkpoints(tmp_path)] == [4, 2]
    assert any(".tmp_step_6" in w for w in warnings_seen)
    assert any("step_5" in w and "incomplete" in w for w in warnings_seen)


def test_a_checkpoint_that_fails_to_load_falls_back_to_the_previous(
    ctx: DistContext, four_step_run: Path, warnings_seen: list[str]
) -> None:
    cfg, tmp_path = config(), four_step_run
    metadata = tmp_path / "checkpoints" / "step_4" / "engine" / ".metadata"
    metadata.write_bytes(b"\0" * metadata.stat().st_size)  # same size, so only loading can tell
    trainer = build_trainer(cfg, ctx, tmp_path)
    resumed = Checkpointer(cfg, tmp_path, ctx, trainer).resume()
    assert resumed is not None and resumed.step == 2
    assert any("step_4" in w for w in warnings_seen)


def test_changed_model_shape_is_refused_naming_the_setting(four_step_run: Path) -> None:
    tmp_path = four_step_run
    newest = find_checkpoints(tmp_path)[0]
    with pytest.raises(ConfigError) as err:
        check_compatible(newest.meta, config(model={"d_model": 64}), newest.path)
    assert err.value.keys == ["model.d_model"]
    assert "model.d_model=32 in the checkpoint, 64 now" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_resume(config(model={"d_model": 64}), tmp_path)  # what `launch` runs first
    assert err.value.keys == ["model.d_model"]
    with pytest.raises(ConfigError) as err:
        check_compatible(newest.meta, config(batch={"global_size": 16}), newest.path)
    assert err.value.keys == ["batch.global_size"]
    # Another split of the same global batch is fine: that is what resharding is for.
    check_compatible(
        newest.meta,
        config(parallel={"dp": 2}, batch={"global_size": 8, "micro_size": 2}),
        newest.path,
    )


def test_resume_never_refuses_to_overwrite_unless_told(four_step_run: Path) -> None:
    tmp_path = four_step_run
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    never = config(train={"resume": "never"})
    with pytest.raises(ConfigError) as err:
        check_resume(never, tmp_path)
    assert err.value.keys == ["train.resume", "checkpoint.overwrite"]
    overwrite = config(train={"resume": "never"}, checkpoint={"overwrite": True})
    check_resume(overwrite, tmp_path)
    run_id = tmp_path / "wandb" / "run_id.txt"
    run_id.parent.mkdir()
    run_id.write_text("0123abcd\n")
    start_fresh(overwrite, tmp_path)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "metrics.jsonl").exists()
    assert not run_id.exists()  # starting over is a new wandb run


def test_resume_never_is_a_new_wandb_run(tmp_path: Path) -> None:
    """Nothing to overwrite (no checkpoint), but training starts at step 1: a new wandb run;
    a resumable start keeps the id (a requeued job continues its wandb run)."""
    run_id = tmp_path / "wandb" / "run_id.txt"
    run_id.parent.mkdir()
    run_id.write_text("0123abcd\n")
    start_fresh(config(), tmp_path)
    assert run_id.read_text() == "0123abcd\n"
    start_fresh(config(train={"resume": "never"}), tmp_path)
    assert not run_id.exists() and run_id.parent.is_dir()


def test_resume_path_must_be_a_complete_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        check_resume(config(train={"resume": str(tmp_path / "nowhere")}), tmp_path)
    assert err.value.keys == ["train.resume"]


def test_fingerprint_ignores_the_split() -> None:
    one = fingerprint(config())
    assert one == fingerprint(config(parallel={"dp": 2}, batch={"global_size": 8, "micro_size": 2}))
    assert one != fingerprint(config(train={"seed": 1}))


class _Exploit:
    def __reduce__(self) -> tuple:
        return (os.system, ("touch pwned",))


def test_checkpoint_metadata_never_runs_code(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(pickle.UnpicklingError):
        SafeReader(str(tmp_path)).read_metadata()
    assert not (Path.cwd() / "pwned").exists()


def test_stop_request_rides_on_the_token_count(ctx: DistContext) -> None:
    cpu = torch.device("cpu")
    assert all_reduce_token_counts(5, 10, cpu, stop=True).stop
    assert not all_reduce_token_counts(5, 10, cpu).stop


@pytest.mark.parametrize(
    ("section", "values", "key"),
    [
        ("optim", {"lr": 0.1}, "optim.lr"),
        ("optim", {"beta2": 0.9}, "optim.beta2"),
        ("data", {"max_len": 5}, "data.max_len"),
    ],
)
def test_settings_the_loaded_state_would_override_are_refused(
    tmp_path: Path, section: str, values: dict, key: str
) -> None:
    """The optimizer and scheduler states carry lr, betas and the schedule: a change would be
    lost."""
    from launcher.checkpoint.compat import check_compatible, fingerprint
    from launcher.config import to_root_config
    from launcher.errors import ConfigError

    saved = {"fingerprint": fingerprint(to_root_config({})), "engine": "ddp"}
    check_compatible(
        saved, to_root_config({"parallel": {"dp": 2}}), tmp_path
    )  # a new split is fine
    with pytest.raises(ConfigError) as info:
        check_compatible(saved, to_root_config({section: values}), tmp_path)
    assert info.value.keys == [key]


def test_a_longer_run_may_resume_with_a_warning(tmp_path: Path) -> None:
    from launcher.checkpoint.compat import check_compatible, fingerprint
    from launcher.config import to_root_config

    saved = {"fingerprint": fingerprint(to_root_config({"train": {"steps": 3}})), "engine": "ddp"}
    # Its own handler: "launcher" may not propagate to pytest's (launcher/logs.py).
    logger, kept = logging.getLogger("launcher.checkpoint"), BufferingHandler(100)
    logger.addHandler(kept)
    try:
        check_compatible(saved, to_root_config({"train": {"steps": 3}}), tmp_path)
        assert kept.buffer == []  # the same length: nothing to say
        check_compatible(saved, to_root_config({"train": {"steps": 5}}), tmp_path)  # no error
    finally:
        logger.removeHandler(kept)
    [record] = kept.buffer
    assert record.levelno == logging.WARNING and record.name == "launcher.checkpoint"
    text = record.getMessage()
    assert "train.steps changed from 3 to 5" in text and str(tmp_path) in text
    assert "schedule is stretched" in text


def test_a_longer_run_is_warned_about_once(
    ctx: DistContext, four_step_run: Path, warnings_seen: list[str]
) -> None:
    """`launch` warns about the newest checkpoint before the ranks start (preflight); a rank
    warns again only about what launch did not judge: an older checkpoint it falls back to, or
    any checkpoint of a restarted attempt."""
    tmp_path = four_step_run  # step_2 and step_4 of a 4-step run
    longer = config(train={"steps": 6})

    def steps_warnings(restarted: bool) -> list[str]:
        warnings_seen.clear()
        trainer = build_trainer(longer, ctx, tmp_path)
        resumed = Checkpointer(longer, tmp_path, ctx, trainer).resume(restarted=restarted)
        assert resumed is not None
        return [w for w in warnings_seen if "train.steps changed from 4 to 6" in w]

    check_resume(longer, tmp_path)  # what launch does first: the one warning
    assert len(warnings_seen) == 1 and "step_4" in warnings_seen[0]
    assert steps_warnings(restarted=False) == []
    assert [w.split(": ")[0] for w in steps_warnings(restarted=True)] == [
        f"train.steps changed from 4 to 6 since checkpoint {tmp_path / 'checkpoints' / 'step_4'}"
    ]
    # The newest damaged in place (its size as written, so only the rank's digest check finds
    # it): the rank resumes step_2, which launch never judged, and says so.
    engine_dir = tmp_path / "checkpoints" / "step_4" / "engine"
    shard = max(engine_dir.glob("*.distcp"), key=os.path.getsize)
    with open(shard, "r+b") as f:
        f.seek(100)
        f.write(bytes(100))
    [fallback] = steps_warnings(restarted=False)
    assert "step_2" in fallback


def test_a_stop_before_the_first_step_saves_nothing_and_starts_over(
    ctx: DistContext, tmp_path: Path, warnings_seen: list[str]
) -> None:
    # An elastic re-rendezvous can stop the ranks before step 1: the optimizer has no state yet,
    # so a step-0 checkpoint could never be resumed (its optimizer keys are missing).
    cfg = config(train={"steps": 2})
    (tmp_path / "stopped").mkdir()
    trainer = build_trainer(cfg, ctx, tmp_path / "stopped")
    assert Checkpointer(cfg, tmp_path / "stopped", ctx, trainer).stop("SIGTERM") is None
    [said] = [w for w in warnings_seen if w.startswith("stopped after step 0")]
    assert "nothing saved (no step was trained yet)" in said
    assert "Run the same command to start over" in said and "resume" not in said
    assert find_checkpoints(tmp_path / "stopped" / "checkpoints") == []
    trainer = build_trainer(cfg, ctx, tmp_path / "stopped")
    checkpoints = Checkpointer(cfg, tmp_path / "stopped", ctx, trainer)
    assert checkpoints.resume(restarted=True) is None
    assert train(trainer, checkpoints, 2) == run(cfg, ctx, tmp_path / "straight")


def test_a_checkpoint_from_before_qkv_rows_by_head_is_refused(tmp_path: Path) -> None:
    # The same shapes in another row order: loading it would scramble the built-in GPT.
    cfg = config()
    legacy = fingerprint(cfg)
    del legacy["model.qkv_rows"]
    with pytest.raises(ConfigError) as err:
        check_compatible({"fingerprint": legacy}, cfg, tmp_path)
    assert err.value.keys == ["train.resume"] and "train.resume=never" in str(err.value)
    check_compatible({"fingerprint": fingerprint(cfg)}, cfg, tmp_path)  # today's: accepted
