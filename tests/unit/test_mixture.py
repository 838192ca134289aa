"""data.sources mixtures: the schedule that sends each position of the order to a source (computed
from the position, the same for every split), each source epoching on its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.config.batch import resolve_batch
from launcher.data.mixture import MixtureDataset
from launcher.data.sampler import MixtureSampler
from launcher.data.schedule import MixtureSchedule
from launcher.data.sequence import Sample

WEIGHTS = {"web": 0.6, "code": 0.3, "books": 0.1}


class Numbered:
    """n samples whose targets hold `tokens` valid positions each."""

    def __init__(self, n: int, tokens: int = 4) -> None:
        self.n, self.tokens = n, tokens

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Sample:
        t = torch.full((4,), index, dtype=torch.long)
        t[self.tokens :] = -100
        return Sample(t, t)

    def eval_problems(self) -> list[tuple[bytes, bytes]]:
        return []


def mixture(sizes: tuple[int, ...] = (50, 23, 7)) -> MixtureDataset:
    return MixtureDataset(list(WEIGHTS), list(WEIGHTS.values()), [Numbered(n) for n in sizes])


def test_three_sources_over_200_steps_within_one_percent_every_step_in_proportion() -> None:
    ds, global_size = mixture(), 32
    sampler = MixtureSampler(ds, global_size, seed=0)
    taken = np.zeros(3, dtype=np.int64)
    for step in range(200):
        per_step = np.bincount(ds.source_of(sampler.batch_array(step)), minlength=3)
        assert per_step.sum() == global_size
        # every global batch in proportion, within the tree's depth (2) of global_size * weight
        assert np.all(np.abs(per_step - global_size * np.array(ds.weights)) <= 2)
        taken += per_step
    realised = taken / taken.sum()
    assert np.all(np.abs(realised - np.array(ds.weights)) < 0.01)
    assert MixtureSchedule(ds.weights).counts(200 * global_size) == taken.tolist()


def test_each_source_epochs_on_its_own() -> None:
    """Source s's draws are its own endless order: every sample once per its own epoch."""
    ds = mixture()
    sampler = MixtureSampler(ds, 16, seed=3)
    drawn = np.concatenate([sampler.batch_array(step) for step in range(100)])
    for s, n in enumerate(ds.lengths):
        mine = drawn[ds.source_of(drawn) == s] - ds.offsets[s]
        for epoch in range(len(mine) // n):
            assert sorted(mine[epoch * n : (epoch + 1) * n].tolist()) == list(range(n))


@pytest.mark.parametrize("dp,micro,accum", [(1, None, 1), (2, 2, None), (4, 1, None), (2, None, 4)])
def test_the_same_samples_in_the_same_steps_for_every_split(
    dp: int, micro: int | None, accum: int | None
) -> None:
    ds, global_size = mixture(), 16
    sampler = MixtureSampler(ds, global_size, seed=1)
    split = resolve_batch(global_size, micro, accum, dp)
    for step in (0, 7, 55):
        taken = [i for r in range(dp) for mb in sampler.micro_batches(step, split, r) for i in mb]
        assert taken == MixtureSampler(ds, global_size, seed=1).global_batch(step)


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=7),
    total=st.integers(0, 50_000),
)
def test_property_counts_match_routing_and_weights(weights: list[float], total: int) -> None:
    schedule = MixtureSchedule(weights)
    source, index = schedule.route(np.arange(total))
    counts = np.bincount(source, minlength=len(weights))
    assert counts.tolist() == schedule.counts(total)
    share = np.array(weights) / sum(weights)
    assert np.all(np.abs(counts - total * share) <= 4)  # depth of a 7-leaf tree, plus rounding
    for s in range(len(weights)):  # each source's own positions 0, 1, 2, ... in turn
        assert index[source == s].tolist() == list(range(int(counts[s])))


def test_report_compares_realised_with_asked() -> None:
    report = mixture().report({"web": 60, "code": 30, "books": 10})
    assert report["code"]["weight"] == pytest.approx(0.3)
    assert report["code"]["fraction"] == pytest.approx(0.3)
    assert (report["code"]["tokens"], report["code"]["samples"]) == (30, 23)


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan"), float("inf")])
def test_a_weight_that_is_not_positive_and_finite_is_refused_by_its_key(weight: float) -> None:
    # inf passed `weight > 0` and became nan shares once normalised (inf / inf)
    from launcher.config.data import DataConfig, DataKind, SourceConfig
    from launcher.errors import ConfigError

    sources = [SourceConfig(name="web", weight=weight, path="a.bin"), SourceConfig("b", 1, "b.bin")]
    with pytest.raises(ConfigError) as info:
        DataConfig(name=DataKind.tokens, sources=sources)
    assert info.value.keys == ["data.sources[0].weight"]


def test_an_hf_source_of_many_files_is_refused_by_its_own_key() -> None:
    # was: "data.path: ... Fix: mix several with data.sources" (the mixture it already was)
    from launcher.config.data import DataConfig, DataKind, SourceConfig
    from launcher.errors import ConfigError

    sources = [SourceConfig("a", 1, "a.jsonl"), SourceConfig("b", 1, "b/*.jsonl")]
    with pytest.raises(ConfigError) as info:
        DataConfig(name=DataKind.hf, tokenizer="t", sources=sources)
    assert info.value.keys == ["data.sources[1].path"]


@pytest.mark.parametrize(
    ("kind", "field", "value"), [("hf", "dtype", "uint32"), ("tokens", "text_field", "body")]
)
def test_a_source_field_its_kind_does_not_read_is_refused(
    kind: str, field: str, value: str
) -> None:
    # was: accepted and silently ignored
    from launcher.config.data import DataConfig, DataKind, SourceConfig
    from launcher.errors import ConfigError

    sources = [SourceConfig("a", 1, "a.bin"), SourceConfig("b", 1, "b.bin", **{field: value})]
    with pytest.raises(ConfigError) as info:
        DataConfig(name=DataKind(kind), tokenizer="t", sources=sources)
    assert info.value.keys == [f"data.sources[1].{field}"]
