"""The launcher's own files inside a directory the user named (a run directory, the data cache)
are never written through a symbolic link (launcher/userpath/own.py): a link planted where the
launcher writes config.yaml, plan.json, metrics.jsonl, summary.json, stopped.json, verify.json,
wandb/run_id.txt, events.jsonl, hang_report.txt, mlflow_run_id.txt, a heartbeat or a cache lock
is refused with one error naming the path and `rm` as the fix, and the file it leads to is
untouched; the old fixed temporary names (`stopped.json.tmp`, ...) are no longer used;
redact_tree never rewrites a file through a link."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from launcher import commands, prepare
from launcher.config import to_root_config
from launcher.config.root import RootConfig
from launcher.errors import ConfigError
from launcher.events import read_events, record_event
from launcher.integrity import digests
from launcher.lifetime import RunLock
from launcher.plan import build_plan
from launcher.rundir import check_own_files, heartbeat_file, stacks_file, write_stopped
from launcher.runners import runner_for
from launcher.secrets import redact_tree
from launcher.tracking.summary import RunShape
from launcher.tracking.tracker import Tracker
from launcher.tracking.wandb_run import run_id
from launcher.verify.compare import compare
from launcher.verify.report import Certificate, write_certificate
from launcher.verify.results import RunResult, StepRecord
from launcher.verify.settings import TOLERANCES, split_config
from launcher.worker.heartbeat import Heartbeat
from tests.planted import Planted, snapshot

SLURM = {"name": "slurm", "python": "/opt/venv/bin/python"}


def config(**sections: object) -> RootConfig:
    return to_root_config({"wandb": {"mode": "disabled"}, **sections})


def plant(link: Path, elsewhere: Path) -> Path:
    """A link at `link` to a file of someone else's in `elsewhere`; that file."""
    elsewhere.mkdir(parents=True, exist_ok=True)
    outside = elsewhere / f"someone_elses_{link.name}"
    outside.write_text("not yours\n")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    return outside


def refused(error: pytest.ExceptionInfo[ConfigError], link: Path) -> None:
    """One error naming the run directory's key, the path and a Fix that works as printed."""
    message = str(error.value)
    assert f"{link} is a symbolic link" in message and "Fix: remove the link" in message
    fix = error.value.fix.split(": ", 1)[1]
    assert fix == f"rm {link}"
    subprocess.run(fix, shell=True, check=True)
    assert not os.path.lexists(link)


@pytest.mark.parametrize(
    "name", ["config.yaml", "plan.json", "train.sbatch", "metrics.jsonl", "wandb/run_id.txt"]
)
def test_plan_refuses_a_link_where_the_launcher_writes_before_writing_anything(
    tmp_path: Path, name: str
) -> None:
    run_dir = tmp_path / "run"
    link = run_dir / name
    outside = plant(link, tmp_path / "elsewhere")
    before = snapshot(run_dir, tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as error:
        commands.plan_command(config(cluster=SLURM), run_dir)
    assert error.value.keys == ["hydra.run.dir"]
    after = snapshot(run_dir, tmp_path / "elsewhere")
    assert {p: e for p, e in after.items() if p.name != ".lock"} == before  # nothing written
    assert outside.read_text() == "not yours\n"
    refused(error, link)
    commands.plan_command(config(cluster=SLURM), run_dir)  # the Fix done: the plan is written
    assert (run_dir / "config.yaml").is_file() and outside.read_text() == "not yours\n"


@pytest.mark.parametrize("name", ["config.yaml", "plan.json", "train.sbatch"])
def test_the_run_files_are_never_written_through_a_link(tmp_path: Path, name: str) -> None:
    """Without the check before (a link planted after it): the write itself refuses."""
    cfg = config(cluster=SLURM)
    plan = build_plan(cfg, tmp_path, runner_for(cfg))
    outside = plant(tmp_path / name, tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as error:
        prepare.write_run_files(cfg, tmp_path, plan)
    assert outside.read_text() == "not yours\n" and (tmp_path / name).is_symlink()
    refused(error, tmp_path / name)


@pytest.mark.parametrize("as_link", [False, True], ids=["partial-file", "partial-link"])
def test_run_files_replace_their_old_selves_and_touch_nothing_planted(
    tmp_path: Path, as_link: bool
) -> None:
    cfg = config(cluster=SLURM)
    plan = build_plan(cfg, tmp_path, runner_for(cfg))
    written = [tmp_path / name for name in ("config.yaml", "plan.json", "train.sbatch")]
    planted = Planted(written, tmp_path / "elsewhere", as_link)
    for _ in range(2):  # new, then replaced
        prepare.write_run_files(cfg, tmp_path, plan)
        planted.unchanged(*written)
    assert os.stat(tmp_path / "train.sbatch").st_mode & 0o777 == 0o755


def test_the_tracker_never_writes_metrics_or_summary_through_a_link(tmp_path: Path) -> None:
    metrics, summary = tmp_path / "metrics.jsonl", tmp_path / "summary.json"
    outside = plant(metrics, tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as error:
        Tracker(tmp_path, total_steps=2, log_every=1, enabled=True)
    assert outside.read_text() == "not yours\n"
    refused(error, metrics)

    line = json.dumps({"step": 1, "loss": 1.0}) + "\n"
    metrics.write_text(line + json.dumps({"step": 2, "loss": 1.0}) + "\n")
    old_temps = [
        plant(tmp_path / f"{name}.tmp", tmp_path / "temps")
        for name in ("metrics.jsonl", "summary.json")
    ]
    tracker = Tracker(tmp_path, total_steps=2, log_every=1, enabled=True)
    tracker.rewind(1)  # rewritten whole, by a temporary file of its own
    assert metrics.read_text() == line
    outside = plant(summary, tmp_path / "elsewhere2")
    shape = RunShape(
        world_size=1, dp=1, micro_size=1, grad_accum=1, global_size=1, engine="ddp", ac="none"
    )
    ended = tracker.summary(
        shape, peak_memory=1, eval_accuracy=None, resumed_from_step=None, activations={}
    )
    with pytest.raises(ConfigError) as error:
        tracker.finish(ended)
    assert outside.read_text() == "not yours\n"
    assert all(temp.read_text() == "not yours\n" for temp in old_temps)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            "metrics.jsonl",
            "summary.json",
            "metrics.jsonl.tmp",
            "summary.json.tmp",
            "elsewhere",
            "elsewhere2",
            "temps",
        ]
    )
    refused(error, summary)


def test_stopped_json_is_never_written_through_a_link(tmp_path: Path) -> None:
    temp = plant(tmp_path / "stopped.json.tmp", tmp_path / "temps")  # the old fixed name
    write_stopped(tmp_path, 3, None, "SIGTERM")
    assert json.loads((tmp_path / "stopped.json").read_text())["step"] == 3
    assert temp.read_text() == "not yours\n" and (tmp_path / "stopped.json.tmp").is_symlink()
    (tmp_path / "stopped.json").unlink()
    outside = plant(tmp_path / "stopped.json", tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as error:
        write_stopped(tmp_path, 4, None, "SIGTERM")
    assert outside.read_text() == "not yours\n"
    refused(error, tmp_path / "stopped.json")


def test_verify_json_is_never_written_through_a_link(tmp_path: Path) -> None:
    cfg = split_config(to_root_config({"model": {"n_layer": 2, "d_model": 32, "n_head": 2}}))
    steps = [StepRecord(1, 2.0, 1.0, 100, 0.1)]
    split = {"global_size": 8, "micro_size": 8, "grad_accum": 1, "dp": 1}
    run = RunResult(split, 1, steps, {"a": torch.ones(3)}, {})
    certificate = Certificate(cfg, run, run, "", compare(run, run, TOLERANCES["fp32"]), None, [])
    outside = plant(tmp_path / "verify.json", tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as error:
        write_certificate(tmp_path, certificate)
    assert outside.read_text() == "not yours\n"
    refused(error, tmp_path / "verify.json")
    assert json.loads(write_certificate(tmp_path, certificate).read_text())["certified"] is True


def test_the_wandb_run_id_is_neither_read_nor_written_through_a_link(tmp_path: Path) -> None:
    link = tmp_path / "wandb" / "run_id.txt"
    outside = plant(link, tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as error:
        run_id(tmp_path)
    assert outside.read_text() == "not yours\n"
    refused(error, link)
    assert run_id(tmp_path) == link.read_text().strip() != "not yours"


def test_redact_tree_never_writes_through_a_link(tmp_path: Path) -> None:
    secret = "export HF_TOKEN=hf_abcdefghijklmnop\n"
    hydra = tmp_path / "run" / ".hydra"
    hydra.mkdir(parents=True)
    own = hydra / "overrides.yaml"
    own.write_text(secret)
    own.chmod(0o600)
    elsewhere = tmp_path / "elsewhere"
    outside = plant(hydra / "config.yaml", elsewhere)
    outside.write_text(secret)
    (elsewhere / "folder").mkdir()
    (elsewhere / "folder" / "notes.txt").write_text(secret)
    (hydra / "folder").symlink_to(elsewhere / "folder")
    before = snapshot(elsewhere, elsewhere / "folder")
    assert redact_tree(hydra) == [own]
    assert secret not in own.read_text() and os.stat(own).st_mode & 0o777 == 0o600
    assert snapshot(elsewhere, elsewhere / "folder") == before
    linked_tree = tmp_path / "linked"
    linked_tree.symlink_to(elsewhere, target_is_directory=True)
    assert redact_tree(linked_tree) == []  # the directory itself a link
    assert snapshot(elsewhere, elsewhere / "folder") == before


def test_the_data_cache_lock_never_truncates_through_a_link(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    from launcher.config.data import DataConfig, DataKind
    from launcher.data.hf import prepare as prepare_hf
    from tests.data_sources import train_tokenizer, write_texts

    texts, cache = write_texts(tmp_path / "texts.jsonl", 8), tmp_path / "cache"
    data = {"path": str(texts), "tokenizer": str(train_tokenizer(tmp_path / "tok"))}
    cfg = DataConfig(name=DataKind.hf, cache_dir=str(cache), **data)  # type: ignore[arg-type]
    built, _ = prepare_hf("data.path", str(texts), cfg)
    shutil.rmtree(built)
    lock = cache / f"{built.name}.lock"
    lock.unlink()
    outside = plant(lock, tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as error:
        prepare_hf("data.path", str(texts), cfg)
    assert error.value.keys == ["data.cache_dir"] and outside.read_text() == "not yours\n"
    assert not built.exists()
    refused(error, lock)
    assert prepare_hf("data.path", str(texts), cfg) == (built, True)
    assert lock.is_file() and not lock.is_symlink()


def test_the_digest_cache_is_never_written_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHER_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data.bin"
    data.write_bytes(b"\0" * 64)
    outside = plant(tmp_path / "cache" / "digests.json", tmp_path / "elsewhere")
    digests.cached_digests([data])  # the cache is skipped, never written through
    assert outside.read_text() == "not yours\n"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["digests.json"]


def test_the_run_directory_lock_is_never_written_through_a_link(tmp_path: Path) -> None:
    outside = plant(tmp_path / ".lock", tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as error:
        RunLock(tmp_path).acquire()
    assert outside.read_text() == "not yours\n"
    refused(error, tmp_path / ".lock")
    with RunLock(tmp_path) as lock:
        assert lock.fd is not None and not (tmp_path / ".lock").is_symlink()


def test_events_hang_report_mlflow_id_and_heartbeats_are_never_written_through_a_link(
    tmp_path: Path,
) -> None:
    """Issue 33's rule for the run directory's other own files: refused at the start, and a link
    planted later is refused by the write itself (events.jsonl was appended through one)."""
    for name in ("events.jsonl", "hang_report.txt", "mlflow_run_id.txt"):
        outside = plant(tmp_path / name, tmp_path / "elsewhere")
        with pytest.raises(ConfigError) as error:
            check_own_files(tmp_path)
        assert outside.read_text() == "not yours\n"
        refused(error, tmp_path / name)
    events = tmp_path / "events.jsonl"
    outside = plant(events, tmp_path / "later")
    with pytest.raises(ConfigError) as error:
        record_event(tmp_path, "hang", ranks=[0])
    assert outside.read_text() == "not yours\n"
    refused(error, events)
    record_event(tmp_path, "hang", ranks=[0])
    assert [e["ranks"] for e in read_events(tmp_path)] == [[0]]

    beat = heartbeat_file(tmp_path, 0)
    outside = plant(beat.with_suffix(".tmp"), tmp_path / "beats")  # the temporary's fixed name
    with pytest.raises(ConfigError):
        Heartbeat(tmp_path, 0, 10.0, lambda step: False)
    assert outside.read_text() == "not yours\n"
    beat.with_suffix(".tmp").unlink()
    heartbeat = Heartbeat(tmp_path, 0, 10.0, lambda step: False)
    assert json.loads(beat.read_text())["phase"] == "start"
    outside = plant(stacks_file(tmp_path, 0), tmp_path / "stacks")
    with pytest.raises(ConfigError):
        heartbeat.dump_stacks_on_signal()
    assert outside.read_text() == "not yours\n"
