"""The generation engine's heart: every request's greedy fp32 output is the one it gets alone,
whatever its neighbours, its arrival and its slot (and the one a plain full-recompute loop
gives); sampled output depends only on the request's own seed."""

from __future__ import annotations

import io
import random
import re

import pytest
import torch
from torch import nn

from launcher.config.data import DataConfig
from launcher.config.model import ModelConfig
from launcher.models.gpt import GPT
from launcher.serve.adapters import GPTAdapter, RecomputeAdapter, adapter_for
from launcher.serve.engine import Engine, Request
from launcher.serve.sampling import Sampling

CONTEXT = 40
CFG = ModelConfig(n_layer=2, n_head=2, d_model=64, seq_len=CONTEXT)


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(CFG).eval()


def workload(n: int, seed: int) -> list[tuple[list[int], int]]:
    """Mixed prompt and output lengths; some run into the context limit."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(256) for _ in range(rng.randint(1, 30))], rng.randint(1, 24))
        for _ in range(n)
    ]


@torch.no_grad()
def full_recompute(model: nn.Module, prompt: list[int], n: int, context: int) -> list[int]:
    """The plain loop: the whole sequence through the model for every token, no cache."""
    out: list[int] = []
    while len(out) < n and len(prompt) + len(out) <= context:
        logits = model(torch.tensor([prompt + out]))
        out.append(int(logits[0, -1].argmax()))
    return out


def alone(model: GPT, prompt: list[int], n: int, sampling: Sampling | None = None) -> list[int]:
    engine = Engine(GPTAdapter(model, 1), 1)
    request = engine.submit(Request(list(prompt), n, sampling or Sampling()))
    engine.run()
    return request.output_ids


def test_batched_continuous_output_equals_alone_and_full_recompute(model: GPT) -> None:
    work = workload(18, seed=1)
    engine = Engine(GPTAdapter(model, 5), 5)
    requests: list[Request] = []
    busiest = 0
    # Arrivals in three waves, while earlier requests are mid-decode.
    for lo, hi, steps in ((0, 6, 3), (6, 12, 5), (12, 18, 0)):
        requests += [engine.submit(Request(list(p), n)) for p, n in work[lo:hi]]
        for _ in range(steps):
            engine.step()
            busiest = max(busiest, len(engine.active))
    while engine.pending():
        engine.step()
        busiest = max(busiest, len(engine.active))
    assert busiest == 5  # requests really were decoded together
    assert {r.slot for r in requests} == set(range(5))
    for request, (prompt, n) in zip(requests, work, strict=True):
        expected = alone(model, prompt, n)
        assert request.output_ids == expected, (prompt, n)
        assert expected == full_recompute(model, prompt, n, CONTEXT)
        limited = len(prompt) + len(expected) > CONTEXT
        assert len(expected) == n or limited
        assert request.finish_reason == "length"
    assert engine.steps < sum(len(r.output_ids) for r in requests)


def test_slot_and_neighbours_do_not_change_a_request(model: GPT) -> None:
    prompt, n = [5, 6, 7, 8, 9], 20
    expected = alone(model, prompt, n)
    for slots, filler_seed in ((2, 3), (4, 4), (7, 5)):
        engine = Engine(GPTAdapter(model, slots), slots)
        fillers = workload(slots + 2, filler_seed)
        for p, k in fillers[: slots - 1]:
            engine.submit(Request(p, k))
        engine.step()
        target = engine.submit(Request(prompt, n))
        for p, k in fillers[slots - 1 :]:
            engine.submit(Request(p, k))
        engine.run()
        assert target.output_ids == expected


def test_sampled_output_depends_only_on_its_seed(model: GPT) -> None:
    sampling = Sampling(temperature=0.9, top_k=40, top_p=0.95, seed=7)
    prompt = [10, 20, 30]
    expected = alone(model, prompt, 16, sampling)
    engine = Engine(GPTAdapter(model, 3), 3)
    for i, (p, k) in enumerate(workload(4, 9)):
        engine.submit(Request(p, k, Sampling(temperature=1.0, seed=100 + i)))
    target = engine.submit(Request(prompt, 16, sampling))
    engine.run()
    assert target.output_ids == expected
    assert alone(model, prompt, 16, Sampling(temperature=0.9, seed=8)) != expected


def test_eos_and_stop_strings_retire_a_request(model: GPT) -> None:
    for prompt, _ in workload(20, seed=6):  # a continuation with a token new at position k
        free = alone(model, prompt, 12)
        k = next((i for i in range(1, len(free)) if free[i] not in free[:i]), 0)
        if k:
            break
    assert k
    engine = Engine(GPTAdapter(model, 2), 2, eos_id=free[k])
    stopped = engine.submit(Request(prompt, 12))
    engine.run()
    assert stopped.output_ids == free[:k] and stopped.finish_reason == "stop"

    def decode(ids: list[int]) -> str:
        return "".join(chr(65 + i % 26) for i in ids)

    stop = decode([free[k]])
    engine = Engine(GPTAdapter(model, 2), 2, decode=decode)
    request = engine.submit(Request(prompt, 12, stop=(stop,)))
    engine.run()
    assert request.finish_reason == "stop"
    assert request.text == decode(free)[: decode(free).index(stop)]


def test_other_models_recompute_exactly(model: GPT) -> None:
    class Plain(nn.Module):  # a user's model: ids -> logits, no cache
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.inner(ids)

    plain = Plain()
    adapter = adapter_for(plain, 3, CONTEXT)
    assert isinstance(adapter, RecomputeAdapter)
    engine = Engine(adapter, 3)
    work = workload(6, seed=2)
    requests = [engine.submit(Request(p, n)) for p, n in work]
    engine.run()
    assert [r.output_ids for r in requests] == [alone(model, p, n) for p, n in work]


def test_transformers_model_through_its_own_cache() -> None:
    transformers = pytest.importorskip("transformers")
    from launcher.models.output import return_logits
    from launcher.serve.adapters import HFAdapter

    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    hf = return_logits(transformers.LlamaForCausalLM(config).eval())  # as the launcher trains it
    adapter = adapter_for(hf, 3, 48)
    assert isinstance(adapter, HFAdapter) and adapter.context == 48
    engine = Engine(adapter, 3)
    rng = random.Random(3)
    work = [
        ([rng.randrange(96) for _ in range(rng.randint(1, 12))], rng.randint(1, 10))
        for _ in range(7)
    ]
    requests = [engine.submit(Request(p, n)) for p, n in work]
    engine.run()
    for request, (prompt, n) in zip(requests, work, strict=True):
        assert request.output_ids == full_recompute(hf, prompt, n, 48)


def test_top_k_and_top_p_keep_the_most_likely() -> None:
    from launcher.serve.sampling import choose

    logits = torch.tensor([0.0, 3.0, 1.0, 2.9, -1.0])
    for sampling in (Sampling(1.0, top_k=1, seed=1), Sampling(1.0, top_p=0.01, seed=1)):
        generator = sampling.generator()
        assert {choose(logits, sampling, generator) for _ in range(50)} == {1}
    two = Sampling(1.0, top_k=2, seed=3)
    generator = two.generator()
    assert {choose(logits, two, generator) for _ in range(200)} == {1, 3}
    draws = [
        [choose(logits, two, g) for _ in range(30)] for g in (two.generator(), two.generator())
    ]
    assert draws[0] == draws[1]  # the seed alone decides


def test_exact_match_counts_greedy_answers(model: GPT) -> None:
    from launcher.worker.evaluate import exact_match

    problems = []
    for i, (prompt, n) in enumerate(workload(9, seed=4)):
        answer = full_recompute(model, prompt, min(n, CONTEXT - len(prompt) + 1), CONTEXT)
        if i % 3 == 0:  # a wrong expected answer
            answer = [(answer[0] + 1) % 256, *answer[1:]]
        problems.append((bytes(prompt), bytes(answer)))
    assert exact_match(model, problems, CONTEXT, torch.device("cpu")) == 6 / 9


class NoCache(nn.Module):
    """A user model as the evaluation sees it: forward(input_ids) -> logits, no KV cache."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.inner = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids)


def _evaluate(model: nn.Module, problems: list, data: DataConfig) -> list[str]:
    from launcher.worker.evaluate import exact_match

    report = io.StringIO()
    exact_match(model, problems, CONTEXT, torch.device("cpu"), data, report=report)
    return report.getvalue().splitlines()


def test_the_evaluation_says_what_it_scores_and_shows_progress(model: GPT) -> None:
    """Issue 33, item 6: it was silent (195 s for a user model) and did not name
    data.eval_problems; without a KV cache the default is bounded (32 problems)."""
    problems = [(bytes(p), bytes([1] * n)) for p, n in workload(40, seed=5)]
    cached = _evaluate(model, problems, DataConfig())
    assert cached[0] == (
        "eval: exact match of greedy decoding on 40 held-out problems "
        "(data.eval_problems=N sets how many)"
    )
    done = [int(re.fullmatch(r"eval (\d+)/40 problems, .*", line)[1]) for line in cached[1:]]
    assert 3 <= len(done) <= 10 and done == sorted(done) and done[-1] == 40  # about every tenth

    slow = _evaluate(NoCache(model), problems, DataConfig())
    assert slow[0].startswith("eval: exact match of greedy decoding on 32 of 40 held-out problems;")
    assert "without a KV cache" in slow[0] and "data.eval_problems=N" in slow[0]
    assert slow[-1].startswith("eval 32/32 problems,")

    chosen = _evaluate(NoCache(model), problems, DataConfig(eval_problems=5))
    assert chosen[0] == (
        "eval: exact match of greedy decoding on 5 of 40 held-out problems "
        "(data.eval_problems=N sets how many)"
    )
    assert chosen[-1].startswith("eval 5/5 problems,")


def test_a_short_run_scores_no_more_problems_than_it_trained_on(model: GPT) -> None:
    """Issue 43: the evaluation's cost follows the run's; data.eval_problems still wins."""
    from launcher.worker.evaluate import exact_match

    problems = [(bytes(p), bytes([1] * n)) for p, n in workload(40, seed=5)]
    assert DataConfig().scored_problems(cached=True, trained=8) == 8
    assert DataConfig().scored_problems(cached=True, trained=400) == 256
    assert DataConfig().scored_problems(cached=False, trained=400) == 32
    assert DataConfig(eval_problems=20).scored_problems(cached=True, trained=8) == 20
    report = io.StringIO()
    exact_match(model, problems, CONTEXT, torch.device("cpu"), DataConfig(), report, trained=8)
    lines = report.getvalue().splitlines()
    assert lines[0] == (
        "eval: exact match of greedy decoding on 8 of 40 held-out problems; by default no more "
        "than the 8 sequences the run trained on (data.eval_problems=N sets how many)"
    )
    assert lines[-1].startswith("eval 8/8 problems,")
    report = io.StringIO()
    exact_match(model, problems, CONTEXT, torch.device("cpu"), DataConfig(), report, trained=400)
    assert report.getvalue().splitlines()[-1].startswith("eval 40/40 problems,")
