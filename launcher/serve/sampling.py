"""Choosing the next token from one request's logits: greedy, or sampled with temperature, top-k
and top-p from the request's own generator (so its draws never depend on its neighbours).

Numerically safe for every temperature above 0, down to the smallest float (5e-324): the logits
minus their maximum, in float64, are divided by the temperature. Every scaled score is then <= 0
and the most likely token's is exactly 0, so a tiny temperature can only send the others to
-inf (probability 0), never overflow to +inf or NaN: the greedy limit, ties shared evenly.
(Dividing the raw float32 logits overflowed to inf at 1e-38 and killed the engine.)"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    """0: greedy (argmax); above 0: sampled."""
    top_k: int = 0
    """Keep the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches p (1.0: all)."""
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self) -> torch.Generator | None:
        """The request's own random stream (None when greedy)."""
        if self.greedy:
            return None
        return torch.Generator(device="cpu").manual_seed(self.seed)


def choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The next token from one row of logits (vocab,)."""
    if sampling.greedy or generator is None:
        return int(logits.argmax())
    scores = logits.detach().to("cpu", torch.float64)
    scores = (scores - scores.max()) / sampling.temperature
    if 0 < sampling.top_k < scores.numel():
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop = probs.cumsum(-1) - probs >= sampling.top_p
        scores[order[drop]] = float("-inf")
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
