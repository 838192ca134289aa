"""Packing with document boundaries (issue 32): a packed micro-batch computes what the same records
padded one per row compute (summed token loss, gradients, each record's logits), for the built-in
GPT, a tiny HF Llama and GPT-2, with and without recompute; concatenated windows give each
document its own attention; the placement is whole, within capacity and deterministic."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from launcher.config.ac import AcConfig, AcPolicy
from launcher.config.data import DataConfig, DataKind
from launcher.config.model import ModelConfig, UserModelConfig
from launcher.data.build import build_datasets
from launcher.data.packed import DocumentWindows, PackedRecords
from launcher.data.packing import place, record_positions
from launcher.data.sequence import Batch, collate_batch
from launcher.models import build_model
from launcher.models.documents import block_causal_mask, document_ids
from launcher.recompute.policies import apply_recompute
from launcher.training.loss import token_loss_sum
from tests.data_sources import CHAT_TEMPLATE, train_tokenizer, write_conversations, write_texts
from tests.installed import require

require("datasets", "transformers")

SEQ = 64
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODELS = ["gpt", "llama", "gpt2"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packing")
    return {
        "tok": train_tokenizer(root / "tok", chat=True),
        "chat": write_conversations(root / "chat.jsonl", 24),
        "texts": write_texts(root / "texts.jsonl", 40),
        "cache": root / "cache",
    }


def chat_data(files: dict[str, Path], **kw: Any) -> Any:
    cfg = DataConfig(
        name=DataKind.hf,
        path=str(files["chat"]),
        tokenizer=str(files["tok"]),
        messages_field="messages",
        chat_template=CHAT_TEMPLATE,
        cache_dir=str(files["cache"]),
        **kw,
    )
    return build_datasets(cfg, SEQ, 0, 256).train


def make_model(kind: str, ac: AcPolicy = AcPolicy.none) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt":
        cfg: Any = ModelConfig(n_layer=2, n_head=2, d_model=32, seq_len=SEQ, vocab_size=256)
    else:
        name = "tiny_llama.json" if kind == "llama" else "tiny_gpt2.json"
        kwargs = {"config": str(FIXTURES / name)}
        cfg = UserModelConfig(
            _target_="launcher.models.hf.build_hf", name="hf", seq_len=SEQ, kwargs=kwargs
        )
    model = build_model(cfg)
    apply_recompute(model, AcConfig(policy=ac), None)
    return model.train()


def run(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed token loss, flat gradient, logits)."""
    model.zero_grad(set_to_none=True)
    logits = model(batch.inputs, **batch.model_kwargs())
    loss = token_loss_sum(logits, batch.targets)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return loss.detach(), grads, logits.detach()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("kind", MODELS)
def test_packed_equals_padded_loss_gradients_and_logits(files: dict[str, Path], kind: str) -> None:
    padded, packed = chat_data(files), chat_data(files, packing=True)
    assert isinstance(packed, PackedRecords) and len(packed) < len(padded)
    rows = collate_batch([padded[i] for i in range(len(padded))])
    windows = collate_batch([packed[i] for i in range(len(packed))])
    assert windows.position_ids is not None and rows.position_ids is None
    model = make_model(kind)
    loss_rows, grad_rows, logits_rows = run(model, rows)
    loss_packed, grad_packed, logits_packed = run(model, windows)
    assert int((rows.targets != -100).sum()) == int((windows.targets != -100).sum())
    assert abs(float(loss_packed / loss_rows) - 1) < 1e-5
    assert rel(grad_packed, grad_rows) < 1e-5
    # Each packed record's logits are that record's own (its padded row: the record alone).
    for w in range(len(packed)):
        at = 0
        for record in packed.order[packed.starts[w] : packed.starts[w + 1]].tolist():
            n = int(record_positions(packed.offsets[record : record + 2], SEQ)[0])
            ours = logits_packed[w, at : at + n]
            alone = logits_rows[record, :n]
            assert torch.allclose(ours, alone, rtol=1e-5, atol=1e-5), (kind, w, record)
            at += n
    # Negative control: the same windows without their positions attend across records.
    _, wrong, _ = run(model, Batch(windows.inputs, windows.targets))
    assert rel(wrong, grad_rows) > 1e-3, rel(wrong, grad_rows)


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_recompute_keeps_packed_gradients(files: dict[str, Path], kind: str) -> None:
    packed = chat_data(files, packing=True)
    windows = collate_batch([packed[i] for i in range(4)])
    loss, grads, _ = run(make_model(kind), windows)
    loss_ac, grads_ac, _ = run(make_model(kind, AcPolicy.full), windows)
    assert abs(float(loss_ac / loss) - 1) < 1e-6 and rel(grads_ac, grads) < 1e-6


def test_concat_windows_give_each_document_its_own_attention(files: dict[str, Path]) -> None:
    cfg = DataConfig(
        name=DataKind.hf,
        path=str(files["texts"]),
        tokenizer=str(files["tok"]),
        cache_dir=str(files["cache"]),
    )
    windows = build_datasets(cfg, 32, 0, 256).train
    assert isinstance(windows, DocumentWindows)
    sample = windows[1]
    assert sample.position_ids is not None
    ids, positions = sample.input_ids, sample.position_ids
    eos = 1  # "</s>": each document ends with it, and the next one starts at position 0
    ends = (ids == eos).nonzero().flatten().tolist()
    assert ends and all(positions[e + 1] == 0 for e in ends if e + 1 < len(ids))
    model = make_model("gpt")
    batch = collate_batch([sample])
    with torch.no_grad():
        logits = model(batch.inputs, **batch.model_kwargs())
        docs = document_ids(batch.position_ids)[0]  # type: ignore[arg-type]
        for d in docs.unique().tolist():
            where = (docs == d).nonzero().flatten()
            alone = model(ids[where][None])
            assert torch.allclose(logits[0, where], alone[0], rtol=1e-5, atol=1e-5)
        across = model(batch.inputs)  # cross_document_attention=true: today's behaviour
    assert not torch.allclose(across, logits, atol=1e-4)
    cfg.cross_document_attention = True
    assert build_datasets(cfg, 32, 0, 256).train[1].position_ids is None


def test_block_causal_mask_follows_transformers_rule() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1]])
    assert document_ids(positions).tolist() == [[0, 0, 0, 1, 1, 2, 3, 3]]
    mask = block_causal_mask(positions)[0, 0]
    assert mask[4].tolist() == [False, False, False, True, True, False, False, False]
    assert mask[2].tolist() == [True, True, True, False, False, False, False, False]


def test_placement_is_whole_within_capacity_and_deterministic() -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(0, 65, size=500)
    order, starts = place(sizes, 64)
    assert sorted(order.tolist()) == [i for i in range(500) if sizes[i] > 0]
    loads = [int(sizes[order[a:b]].sum()) for a, b in itertools.pairwise(starts)]
    assert max(loads) <= 64 and min(loads) > 0
    assert len(loads) <= -(-int(sizes.sum()) // 64) * 11 // 10 + 1  # near the lower bound
    again = place(sizes, 64)
    assert np.array_equal(again[0], order) and np.array_equal(again[1], starts)
