"""Datasets, the deterministic global-batch sampler and collation."""

from launcher.data.build import build_dataset
from launcher.data.sampler import GlobalBatchSampler
from launcher.data.sequence import IGNORE_INDEX, Sample, TokenDataset

__all__ = ["IGNORE_INDEX", "GlobalBatchSampler", "Sample", "TokenDataset", "build_dataset"]
