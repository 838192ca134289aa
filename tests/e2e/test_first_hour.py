"""The first hour of a new user, walked through the docs (issue 33, item 6): what they type from
their own project's directory works, and every printed Fix reads as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, read_metrics, read_summary, run_launch
from tests.inprocess import completed, runs_in_process

pytestmark = pytest.mark.e2e

LAUNCH = str(Path(sys.executable).with_name("launch"))
"""The console script a user runs: unlike `python -m`, it puts no directory on sys.path."""
EXAMPLE = REPO / "examples" / "own_project"
TOKENIZER = EXAMPLE / "data" / "tokenizer"  # 512 tokens; the built-in models' bytes are 256
HF_DATA = [
    "data=hf",
    f"data.path={EXAMPLE / 'data' / 'corpus.jsonl'}",
    f"data.tokenizer={TOKENIZER}",
]

DATASET = """
import torch


class Counting:
    def __len__(self):
        return 64

    def __getitem__(self, index):
        ids = (torch.arange(17) + index) % 200
        return {"input_ids": ids[:-1], "labels": ids[1:]}


def make_dataset():
    return Counting()
"""


def _launch_from(cwd: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [LAUNCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_custom_data_imports_from_the_working_directory(tmp_path: Path) -> None:
    """`data=custom data._target_=...` found the user's package only with PYTHONPATH=.
    (`model=custom` found it without); and its Fix sent the user the wrong way."""
    package = tmp_path / "first_hour_data"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "data.py").write_text(DATASET)
    own = ["data=custom", "data._target_=first_hour_data.data.make_dataset", "model.seq_len=16"]
    proc = _launch_from(tmp_path, ["plan", *own, f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "run" / "plan.json").is_file()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _launch_from(elsewhere, ["plan", *own, f"hydra.run.dir={tmp_path / 'refused'}"])
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()  # one line, no traceback
    assert line.startswith(
        "error: data._target_: 'first_hour_data.data.make_dataset' does not import "
        "(ModuleNotFoundError: No module named 'first_hour_data'). Fix: run launch from the "
        f"directory that holds first_hour_data/ (now {elsewhere}"
    ), line
    # The Fix as written, from the directory that holds the package: the first launch above.


def test_the_wandb_key_fix_is_printed_as_written(tmp_path: Path) -> None:
    """The secret redactor ate the placeholder of its own Fix: `export WANDB_API_KEY=REDACTED
    key>`. A real key is still redacted (tests/e2e/test_secrets.py, test_wandb_secrets.py).
    Online without a key is refused at start, before anything is written (`launch plan` makes
    the same check: prepare_run; wandb.required=false: tests/e2e/test_wandb_failures.py)."""
    no_key = {"WANDB_API_KEY": "", "HOME": str(tmp_path), "NETRC": str(tmp_path / "netrc")}
    run_dir = tmp_path / "run"
    proc = run_launch(["train", "wandb.mode=online"], run_dir, env=no_key, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: wandb.mode, wandb.required: "), proc.stderr
    assert "Fix: export WANDB_API_KEY=<your key> or run `wandb login`;" in proc.stderr
    assert "wandb.required=false" in proc.stderr and "Traceback" not in proc.stderr
    assert "REDACTED" not in proc.stderr
    assert not run_dir.exists()  # no config.yaml, metrics or wandb files


def _readme_commands() -> list[str]:
    """The `launch ...` lines of the example's README code blocks (continuations joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", (EXAMPLE / "README.md").read_text(), re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [line.split("#")[0].strip() for line in lines if line.startswith("launch ")]


def test_the_example_data_hf_command_runs_as_written(tmp_path: Path) -> None:
    """Issue 33, item 6: the first data=hf run of the shipped example was refused (a tokenizer of
    512 tokens, a model of 256). The vocabulary now follows the tokenizer, said in the plan."""
    [command] = [c for c in _readme_commands() if "data=hf" in c]
    assert command.startswith("launch train ")
    run_dir = tmp_path / "run"
    cheap = ["train.steps=2", "eval.every=2", "wandb.mode=disabled", f"hydra.run.dir={run_dir}"]
    mine = {a.split("=", 1)[0] for a in cheap}
    args = [a for a in shlex.split(command)[1:] if a.split("=", 1)[0] not in mine] + cheap
    env = {"LAUNCHER_CACHE": str(tmp_path / "cache")}
    if runs_in_process(args, env):
        proc = completed(args, EXAMPLE, env)
    else:
        proc = subprocess.run(
            [LAUNCH, *args], cwd=EXAMPLE, env={**os.environ, **env}, capture_output=True, text=True
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "vocabulary 512 (the tokenizer's)" in proc.stdout
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["vocab_size"], plan["vocab_from"]) == (512, "data.tokenizer")
    assert "  vocab_size: 512\n" in (run_dir / "config.yaml").read_text()  # what the ranks build
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2]
    assert read_summary(run_dir)["final_val_loss"] is not None


def test_an_hf_config_model_follows_the_tokenizer_too(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = REPO / "tests" / "fixtures" / "tiny_llama.json"  # vocab_size 256
    args = ["plan", *HF_DATA, "model=hf", f"model.config={config}", "model.seq_len=16"]
    proc = run_launch([*args, f"data.cache_dir={tmp_path / 'cache'}"], run_dir)
    assert "vocabulary 512 (the tokenizer's)" in proc.stdout
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["vocab_size"], plan["vocab_from"]) == (512, "data.tokenizer")
    assert "  vocab_size: 512\n" in (run_dir / "config.yaml").read_text()
