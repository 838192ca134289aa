"""Small data is told the truth (issue 43): a global batch larger than an epoch of 12 chat
records says so at start, once, with the numbers; a packed run says how many records went into
how many windows and their fill. One process, one step each, and the numbers checked against
the tokenized cache itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from launcher.data.packing import place, record_positions
from tests.data_sources import CHAT_TEMPLATE, train_tokenizer, write_conversations
from tests.helpers import FAST, run_launch
from tests.installed import require

require("datasets", "transformers")

pytestmark = pytest.mark.e2e

SEQ_LEN = 64


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("small")
    tok = train_tokenizer(root / "tok", chat=True)
    (root / "chat.jinja").write_text(CHAT_TEMPLATE)
    return [
        "train",
        *FAST,
        f"model.seq_len={SEQ_LEN}",
        "train.steps=1",
        "checkpoint.enabled=false",
        "data=hf",
        f"data.path={write_conversations(root / 'chat.jsonl', 12)}",
        f"data.tokenizer={tok}",
        "data.messages_field=messages",
        f"data.chat_template={root / 'chat.jinja'}",
        f"data.cache_dir={root / 'cache'}",
    ]


def test_a_global_batch_past_an_epoch_says_so_once(chat: list[str], tmp_path: Path) -> None:
    proc = run_launch([*chat, "batch.global_size=32"], tmp_path / "run")
    said = [line for line in proc.stderr.splitlines() if "than an epoch" in line]
    assert len(said) == 1, proc.stderr
    assert said[0].startswith("warning: the global batch of 32 sequences is larger than an epoch")
    assert "12 samples: each step sees every one 2.67 times on average" in said[0]
    assert "Fix: set batch.global_size=12 (the largest batch within an epoch" in said[0]
    assert "windows" not in proc.stdout  # one record per sequence: nothing packed


def test_a_packed_run_says_its_windows(chat: list[str], tmp_path: Path) -> None:
    proc = run_launch([*chat, "data.packing=true", "batch.global_size=16"], tmp_path / "run")
    # The right answer from the cache itself: its records, their positions, their windows.
    (cache,) = [p.parent for p in Path(chat[-1].split("=", 1)[1]).glob("*/offsets.npy")]
    offsets = np.load(cache / "offsets.npy")
    positions = record_positions(offsets, SEQ_LEN)
    windows = len(place(positions, SEQ_LEN)[1]) - 1
    fill = positions.sum() / (windows * SEQ_LEN)
    assert 1 < windows < 12  # several records share a window
    line = next(line for line in proc.stdout.splitlines() if "windows" in line)
    assert line == (
        f"data.packing=true: 12 records went into {windows} windows of {SEQ_LEN} positions, "
        f"fill {fill:.1%} (the rest is padding)"
    )
    said = [line for line in proc.stderr.splitlines() if "than an epoch" in line]
    assert (
        len(said) == 1
        and f"an epoch of the data, {windows} windows (12 records packed)" in (said[0])
    )
