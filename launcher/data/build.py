"""Pick the dataset named by data.name."""

from __future__ import annotations

from pathlib import Path

from launcher.config.data import DataConfig, DataKind
from launcher.data.files import JsonlDataset, TextDataset
from launcher.data.reverse import ReverseDataset
from launcher.data.sequence import TokenDataset


def build_dataset(cfg: DataConfig, seq_len: int, seed: int) -> TokenDataset:
    if cfg.name == DataKind.reverse:
        return ReverseDataset(cfg, seq_len, seed)
    assert cfg.path is not None  # DataConfig checks this
    if cfg.name == DataKind.text:
        return TextDataset(Path(cfg.path), seq_len)
    return JsonlDataset(Path(cfg.path), seq_len, cfg.eval_problems)
