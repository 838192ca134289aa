"""Every "Fix:" works as written (issue 22): for a sample of errors, each fix the message prints
that is an override (`key=value`, `+key=value`, or `key in {a, b}`), applied to the refused
command line, makes `launch plan` accept it. Placeholders (FILE, DIR, N) are not commands."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO, run_launch

pytestmark = pytest.mark.e2e

OVERRIDE = re.compile(r"(?<![\w.+])(\+{0,2}[a-z_]+(?:\.[a-z_]+)+=[^\s,;()]+)")
CHOICES = re.compile(r"(\+?[a-z_]+(?:\.[a-z_]+)+) in \{([^}]*)\}")


def fixes(message: str) -> list[str]:
    """The overrides a message's Fix: offers, without placeholders."""
    text = message.split("Fix:", 1)[1]
    found = [m.rstrip(".") for m in OVERRIDE.findall(text)]
    for key, values in CHOICES.findall(text):
        found += [f"{key}={v.strip()}" for v in values.split(",")]
    return [f for f in found if not re.search(r"=[A-Z]+$", f)]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fixes")
    big = root / "big.bin"
    np.array([1, 2, 300] * 40, dtype=np.uint16).tofile(big)  # a token id past 256
    return {"big": big, "example": REPO / "examples" / "own_project" / "data"}


def _cases(d: dict[str, Path]) -> dict[str, list[str]]:
    tokens = ["data=tokens", f"data.path={d['big']}"]
    tiny = ["model.seq_len=16"]
    example = d.get("example", Path())
    hf = ["data=hf", f"data.path={example}/corpus.jsonl", f"data.tokenizer={example}/tokenizer"]
    return {
        "builtin_tokens": [*tokens, *tiny],
        "hf_config_tokens": [
            *tokens,
            "model=hf",
            f"model.config={REPO}/tests/fixtures/tiny_llama.json",
            *tiny,
        ],
        "target_tokens": [
            *tokens,
            "model=custom",
            "model._target_=tests.fixtures.models.TinyLM",
            *tiny,
        ],
        # A tokenizer of 512 tokens and a vocabulary set too small on purpose (unset, it
        # follows the tokenizer): the fix's key differs by model, each works as printed.
        "builtin_hf": [*hf, "model.vocab_size=300", *tiny],
        "hf_config_hf": [
            *hf,
            "model=hf",
            f"model.config={REPO}/tests/fixtures/tiny_llama.json",
            "+model.vocab_size=300",
            *tiny,
        ],
        "batch_split": ["parallel.dp=3", "batch.global_size=4"],
        "eval_without_heldout": [*tokens, "model.vocab_size=301", "eval.every=5", *tiny],
    }


CASES = list(_cases({"big": Path()}))


@pytest.mark.parametrize("case", CASES)
def test_each_printed_fix_makes_the_command_pass(
    case: str, data: dict[str, Path], tmp_path: Path
) -> None:
    args = [*_cases(data)[case], f"data.cache_dir={tmp_path}/cache"]
    refused = run_launch(["plan", *args], tmp_path / "refused", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = next(line for line in refused.stderr.splitlines() if "Fix:" in line)
    offered = fixes(message)
    assert offered, message
    for i, fix in enumerate(offered):
        key = fix.lstrip("+").split("=", 1)[0]
        kept = [a for a in args if a.lstrip("+").split("=", 1)[0] != key]
        run_launch(["plan", *kept, fix], tmp_path / f"fixed_{i}")  # raises with the output
