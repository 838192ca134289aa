"""`launch train` on token files, tokenized HF datasets and custom datasets, with the validation
loss (issue 13): the same curves for every split, eval that never disturbs training, clear
refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.data_sources import train_tokenizer, write_pairs, write_tokens
from tests.helpers import FAST, max_rel_diff, read_losses, read_metrics, read_summary, run_launch

pytestmark = [pytest.mark.e2e]

SMALL = [*FAST, "train.steps=5", "batch.global_size=8", "model.seq_len=16", "checkpoint.every=0"]


def test_tokens_dp2_equals_dp1_and_eval_never_disturbs_training(tmp_path: Path) -> None:
    train = write_tokens(tmp_path / "train.bin", 16 * 64 + 1)
    val = write_tokens(tmp_path / "val.bin", 16 * 12 + 1, seed=1)
    data = ["data=tokens", f"data.path={train}", f"data.val_path={val}", "eval.batches=2"]
    runs = {
        "dp1_eval": ["parallel.dp=1", "batch.grad_accum=2", "eval.every=2"],
        "dp1_plain": ["parallel.dp=1", "batch.grad_accum=2", "eval.every=0"],
        "dp2_eval": ["parallel.dp=2", "batch.micro_size=2", "eval.every=2"],
    }
    for name, extra in runs.items():
        run_launch(["train", *SMALL, *data, *extra], tmp_path / name)
    with_eval, plain = read_losses(tmp_path / "dp1_eval"), read_losses(tmp_path / "dp1_plain")
    assert with_eval == plain  # bit for bit: evaluation leaves the RNG and data order alone
    assert max_rel_diff(read_losses(tmp_path / "dp2_eval"), with_eval) < 1e-5
    val1 = [m["val_loss"] for m in read_metrics(tmp_path / "dp1_eval")]
    val2 = [m["val_loss"] for m in read_metrics(tmp_path / "dp2_eval")]
    assert [v is not None for v in val1] == [False, True, False, True, True]  # 2, 4 and the last
    assert all(m["val_loss"] is None for m in read_metrics(tmp_path / "dp1_plain"))
    assert max_rel_diff([v for v in val2 if v], [v for v in val1 if v]) < 1e-5
    assert read_summary(tmp_path / "dp1_eval")["final_val_loss"] == val1[-1]
    assert read_summary(tmp_path / "dp1_plain")["final_val_loss"] is None


def test_hf_prompt_completion_with_a_local_tokenizer_reuses_its_cache(tmp_path: Path) -> None:
    tok = train_tokenizer(tmp_path / "tok")
    pairs = write_pairs(tmp_path / "pairs.jsonl", 48)
    cache = tmp_path / "cache"
    args = [
        "train",
        *SMALL,
        "data=hf",
        f"data.path={pairs}",
        f"data.tokenizer={tok}",
        "data.prompt_field=prompt",
        "data.completion_field=completion",
        f"data.cache_dir={cache}",
        "data.holdout=8",
        "eval.every=5",
        "model.seq_len=32",
    ]
    first = run_launch(args, tmp_path / "first")
    assert "tokenizing" in first.stdout + first.stderr
    built = sorted(p.name for p in cache.iterdir())
    second = run_launch(args, tmp_path / "second")
    assert "tokenizing" not in second.stdout + second.stderr
    assert sorted(p.name for p in cache.iterdir()) == built
    losses = read_losses(tmp_path / "second")
    assert losses == read_losses(tmp_path / "first") and len(losses) == 5
    assert read_summary(tmp_path / "second")["final_val_loss"] is not None


def test_custom_dataset_by_target(tmp_path: Path) -> None:
    run_launch(
        [
            "train",
            *SMALL,
            "data=custom",
            "data._target_=tests.data_sources.make_dataset",
            "+data.args.size=40",
            "data.holdout=8",
            "eval.every=5",
        ],
        tmp_path / "run",
    )
    metrics = read_metrics(tmp_path / "run")
    assert len(metrics) == 5 and metrics[-1]["val_loss"] is not None


@pytest.mark.parametrize("case", ["odd_size", "past_vocab", "missing"])
def test_bad_token_file_is_refused_before_anything_starts(tmp_path: Path, case: str) -> None:
    path = tmp_path / "train.bin"
    if case == "odd_size":
        path.write_bytes(b"\x01" * 1001)
    elif case == "past_vocab":
        write_tokens(path, 2000, vocab=300)
    args = ["train", *SMALL, "data=tokens", f"data.path={path}"]
    proc = run_launch(args, tmp_path / "run", check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "data.path" in err and str(path) in err and "Fix:" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    json.dumps(err)  # one message, printable
