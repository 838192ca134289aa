"""One trained run shared by the serving tests of several modules: a tiny Llama (model=hf) on
prompt/completion data with a small BPE tokenizer that has a chat template. Trained once per test
session (in the session's base temp directory), whichever module asks first."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.data_sources import train_tokenizer, write_pairs
from tests.harness import free_port
from tests.helpers import REPO, run_launch
from tests.once import built_once
from tests.served import ServedLaunch, popen

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
TRAIN = [
    "train",
    "model=hf",
    "model.config=tests/fixtures/tiny_llama.json",
    "model.seq_len=32",
    "train.steps=3",
    "batch.global_size=8",
    "checkpoint.every=0",
    "wandb.mode=disabled",
    "data=hf",
    "data.prompt_field=prompt",
    "data.completion_field=completion",
]


def with_chat_template(tokenizer: Path) -> Path:
    """The tokenizer directory as transformers saves one with a chat template."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    }
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer


def shared_run(factory: pytest.TempPathFactory) -> Path:
    """Trained once per test run (tests/once.py), read by the serve and generate tests."""

    def build(root: Path) -> None:
        root.mkdir()
        tok = with_chat_template(train_tokenizer(root / "tok"))
        pairs = write_pairs(root / "pairs.jsonl", 48)
        data = [f"data.path={pairs}", f"data.tokenizer={tok}", f"data.cache_dir={root / 'cache'}"]
        run_launch([*TRAIN, *data], root / "run")

    return built_once(factory, "serve-hf-run", build, done="run/summary.json") / "run"


def start_serve(
    run: Path, log: Path, *overrides: str
) -> tuple[str, ServedLaunch | subprocess.Popen[Any]]:
    """`launch serve RUN` on a free port of 127.0.0.1, its output in `log`, once /health answers
    200 (two minutes at most): its base URL and its process (the caller stops it). Forked from
    the tests' warm server where it can be (tests/served.py), else a new interpreter."""
    port = free_port()
    args = ["serve", str(run), f"serve.port={port}", *overrides]
    with open(log, "wb") as out:
        proc = popen(args, REPO, dict(os.environ), stdout=out, stderr=out)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return base, proc
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
