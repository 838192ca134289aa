"""A data.sources mixture through `launch`: tokens per source in metrics.jsonl and summary.json,
the same samples in the same steps on dp=1 and dp=2, and a kill -9 resumed bitwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data_sources import write_tokens
from tests.e2e.test_resume import ENV, Launch, last_per_step
from tests.helpers import FAST, max_rel_diff, read_metrics, read_summary, run_launch
from tests.once import built_once

pytestmark = [pytest.mark.e2e]

STEPS, SEQ = 10, 16
NAMES = ("web", "code", "books")


def mixture_args(data: Path) -> list[str]:
    sources = (
        f"data.sources=[{{name:web,path:{data}/web/*.bin,weight:0.5}},"
        f"{{name:code,path:{data}/code.bin,weight:0.3}},"
        f"{{name:books,path:{data}/books.bin,weight:0.2}}]"
    )
    return [
        "train",
        *FAST,
        f"train.steps={STEPS}",
        f"model.seq_len={SEQ}",
        "batch.global_size=10",
        "data=tokens",
        "data.dtype=uint16",
        sources,
    ]


def make_data(root: Path) -> Path:
    (root / "web").mkdir(parents=True)
    for i, windows in enumerate((9, 6)):
        write_tokens(root / "web" / f"train-{i:05d}.bin", windows * SEQ + 1, seed=i)
    write_tokens(root / "code.bin", 7 * SEQ + 1, seed=5)
    write_tokens(root / "books.bin", 3 * SEQ + 1, seed=6)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("mixture") / "data")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, data: Path) -> Path:
    """The undisturbed dp=1 run (2 micro-batches of 5), checkpoints every 3 steps."""
    return built_once(
        tmp_path_factory,
        "mixture_reference",
        lambda path: run_launch(
            [*mixture_args(data), "batch.micro_size=5", "checkpoint.every=3"], path, env=ENV
        ),
    )


def test_tokens_per_source_in_metrics_and_summary(reference: Path) -> None:
    lines = read_metrics(reference)
    assert len(lines) == STEPS
    for m in lines:
        assert sum(m[f"tokens/{n}"] for n in NAMES) == m["tokens"]
    # 10 samples a step: 5 web, 3 code, 2 books, every step; every window here is full
    assert {(m["tokens/web"], m["tokens/code"], m["tokens/books"]) for m in lines} == {
        (5 * SEQ, 3 * SEQ, 2 * SEQ)
    }
    mixture = read_summary(reference)["mixture"]
    assert list(mixture) == list(NAMES)
    for name, weight in zip(NAMES, (0.5, 0.3, 0.2), strict=True):
        assert mixture[name]["weight"] == pytest.approx(weight)
        assert mixture[name]["fraction"] == pytest.approx(weight)
        assert mixture[name]["tokens"] == sum(m[f"tokens/{name}"] for m in lines)


@pytest.mark.multiproc
def test_dp2_trains_the_same_samples_in_the_same_steps(
    reference: Path, data: Path, tmp_path: Path
) -> None:
    run_launch([*mixture_args(data), "parallel.dp=2", "batch.micro_size=5"], tmp_path, env=ENV)
    one, two = read_metrics(reference), read_metrics(tmp_path)
    for name in NAMES:
        assert [m[f"tokens/{name}"] for m in two] == [m[f"tokens/{name}"] for m in one]
    assert max_rel_diff([m["loss"] for m in two], [m["loss"] for m in one]) < 1e-5


def test_kill_9_then_the_same_command_resumes_bitwise(
    reference: Path, data: Path, tmp_path: Path
) -> None:
    args = [*mixture_args(data), "batch.micro_size=5", "checkpoint.every=3"]
    run_dir = tmp_path / "run"
    launch = Launch([*args, "debug.step_sleep_s=0.3"], run_dir)
    launch.wait_for_step(5)
    launch.proc.kill()  # SIGKILL: no checkpoint of its own, the one of step 3 stays
    launch.wait()
    proc = run_launch(args, run_dir, env=ENV)
    assert "resuming from" in proc.stdout
    assert last_per_step(run_dir) == last_per_step(reference)  # bitwise
    by_step = {m["step"]: m for m in read_metrics(run_dir)}
    for m in read_metrics(reference):
        assert all(by_step[m["step"]][f"tokens/{n}"] == m[f"tokens/{n}"] for n in NAMES)
    assert read_summary(run_dir)["mixture"] == read_summary(reference)["mixture"]
