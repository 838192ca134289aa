"""wandb through the `launch` command, offline: its files hold metrics.jsonl's numbers, a resumed
run continues the same wandb run, and console output to a pipe is plain lines. (Two ranks, one
wandb run from rank 0: tests/e2e/test_data_parallel.py's dp=2 run.)"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from launcher.tracking.tracker import METRIC_KEYS
from tests.helpers import FAST, read_metrics, read_summary, run_launch

pytestmark = pytest.mark.e2e

SMALL = [a for a in FAST if not a.startswith("wandb.")] + [
    "batch.global_size=8",
    "batch.micro_size=4",
]
CONTROL = re.compile(r"[\r\x1b\x08]")


def read_wandb_records(path: Path) -> list[Any]:
    """The records of an offline run's .wandb file, decoded with wandb's own protobuf schema.

    The file is a 7-byte W&B header, then LevelDB-log framing: 32 KiB blocks of chunks, each
    with a 7-byte header (CRC32, length, type: 1 full, 2 first, 3 middle, 4 last).
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb data file"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # too little room for a header: the block is padded
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding up to the block's end
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _items(items: Any) -> dict[str, Any]:
    return {(item.key or ".".join(item.nested_key)): json.loads(item.value_json) for item in items}


def wandb_history(records: list[Any]) -> list[dict[str, Any]]:
    return [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]


def wandb_config(records: list[Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for r in records:
        if r.WhichOneof("record_type") == "run":
            config.update(_items(r.run.config.update))
        elif r.WhichOneof("record_type") == "config":
            config.update(_items(r.config.update))
    return config


def wandb_summary(records: list[Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(_items(r.summary.update))
    return summary


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def test_offline_run_holds_the_metrics_and_a_resumed_run_continues_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["train", *SMALL, "train.log_every=2", "wandb.mode=offline", "wandb.tags=[ci,e2e]"]
    proc = run_launch([*args, "train.steps=3"], run_dir)

    # The console (a pipe here): plain lines at step 1, every train.log_every steps and the last.
    output = proc.stdout + proc.stderr
    assert not CONTROL.search(output), "progress-bar control characters in non-terminal output"
    assert re.findall(r"^step (\d+)/3 loss", proc.stdout, re.MULTILINE) == ["1", "2", "3"]
    assert proc.stdout.count("tokens/step") == 1  # the plan, printed once at start

    run_id = (run_dir / "wandb" / "run_id.txt").read_text().strip()
    [first] = offline_runs(run_dir)
    assert first.name.endswith(f"-{run_id}")
    records = read_wandb_records(first / f"run-{run_id}.wandb")
    config = wandb_config(records)
    assert config["train"]["steps"] == 3 and config["wandb"]["mode"] == "offline"
    assert config["derived"]["tokens_per_step"] == 8 * 24
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (
        run.project == "launcher" and run.display_name == "run" and list(run.tags) == ["ci", "e2e"]
    )
    assert run.run_group == ""  # wandb.group null stays unset
    assert read_summary(run_dir)["wandb_run_id"] == run_id

    # Launched again with more steps: it resumes from the checkpoint, into the same wandb run.
    run_launch([*args, "train.steps=5"], run_dir)
    assert (run_dir / "wandb" / "run_id.txt").read_text().strip() == run_id
    runs = offline_runs(run_dir)
    assert len(runs) == 2 and all(r.name.endswith(f"-{run_id}") for r in runs)
    summary = read_summary(run_dir)
    assert summary["wandb_run_id"] == run_id and summary["resumed_from_step"] == 3

    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    for line in metrics:
        assert set(METRIC_KEYS) <= set(line), set(METRIC_KEYS) - set(line)
        assert line["mfu"] is None  # CPU, no train.peak_flops: no meaningful peak
    history = [
        row for r in runs for row in wandb_history(read_wandb_records(r / f"run-{run_id}.wandb"))
    ]
    assert len(history) == len(metrics)
    for line, row in zip(metrics, history, strict=True):
        assert {k: row[k] for k in line} == line  # the same numbers as metrics.jsonl
    # Started over (train.resume=never) is a new wandb run: start_fresh forgets the run id
    # (tests/unit/test_checkpoint.py), and test_bad_day starts a run over through `launch`.
