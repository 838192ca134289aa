"""lm-evaluation-harness's model interface on a run's checkpoint: every request answered through
the serving engine (launcher/serve/engine.py), many at once in its slots.

Tokens are chosen as lm-eval's `hf` model chooses them on the export of the same checkpoint, so
that the two score alike (tests/e2e/test_harness.py): a continuation is the tokens of
context+continuation after those of the context (TemplateLM's _encode_pair); a too long pair keeps
its last max_length+1 tokens and scores the last one from the logits after the others (the
engine's `score_next`); a generation's context keeps its last max_length-max_gen_toks tokens.
"""

from __future__ import annotations

from typing import Any

from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM

from launcher.serve.engine import Engine, EngineBroken
from launcher.serve.load import LoadedRun
from launcher.serve.request import Request
from launcher.serve.sampling import Sampling

Pair = tuple[tuple[str, str], list[int], list[int]]


class HarnessFailed(RuntimeError):
    """The engine failed a request lm-eval asked for (a score is all or nothing)."""


class LauncherLM(TemplateLM):
    """An lm-eval model answering loglikelihood, loglikelihood_rolling and generate_until."""

    def __init__(self, run: LoadedRun, engine: Engine, max_gen_toks: int, seed: int = 0) -> None:
        super().__init__()
        self.run, self.engine, self.default_gen_toks, self.seed = run, engine, max_gen_toks, seed
        self.max_length = engine.context

    @property
    def eot_token_id(self) -> int:
        # The run's end-of-sequence token conditions an empty context; bytes without one: 0.
        return self.run.codec.eos_id if self.run.codec.eos_id is not None else 0

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **_: Any
    ) -> list[int]:
        return self.run.codec.encode(string)

    def _answer(self, requests: list[Request]) -> None:
        """Every request through the engine (it holds `slots` at once)."""
        for request in requests:
            self.engine.waiting.append(request)  # the whole list is the queue
        try:
            self.engine.run()
        except EngineBroken as exc:
            raise HarnessFailed(f"the engine failed: {exc}") from None
        failed = [r for r in requests if r.finish_reason == "error"]
        if failed:
            raise HarnessFailed(f"{len(failed)} requests failed; the first: {failed[0].error}")

    def _loglikelihood_tokens(self, requests: list[Pair], **_: Any) -> list[tuple[float, bool]]:
        asked = []
        for _key, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1) :]
            asked.append(
                Request(
                    whole[:-1],
                    0,
                    logprobs=1,  # the most likely token: is the continuation greedy?
                    echo=True,
                    score_next=whole[-1],
                    tag=len(continuation),
                )
            )
        self._answer(asked)
        answers = []
        for request in asked:
            assert isinstance(request.tag, int) and request.next_score is not None
            scored = [*request.prompt_scores[1:], request.next_score][-request.tag :]
            total = sum(float(s.logprob or 0.0) for s in scored)
            greedy = all(s.top and s.top[0][0] == s.token for s in scored)
            answers.append((total, greedy))
        return answers

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """A whole text's log-likelihood in disjoint windows of the model's context."""
        del disable_tqdm
        pairs: list[Pair] = []
        counts = []
        for (text,) in (r.args for r in requests):
            windows = [
                lm_utils.make_disjoint_window(w)
                for w in lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            pairs += [(("", ""), list(c), list(t)) for c, t in windows]
            counts.append(len(windows))
        scores = self._loglikelihood_tokens(pairs)
        totals, start = [], 0
        for count in counts:
            totals.append(sum(s for s, _ in scores[start : start + count]))
            start += count
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        del disable_tqdm
        asked = []
        for index, (context, kwargs) in enumerate(r.args for r in requests):
            kwargs = dict(kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            new = int(kwargs.pop("max_gen_toks", self.default_gen_toks))
            temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
            if not kwargs.pop("do_sample", False):
                temperature = 0.0
            ids = self.tok_encode(context)[-max(1, self.max_length - new) :]
            sampling = Sampling(temperature, 0, 1.0, self.seed + index)
            asked.append(Request(ids, new, sampling, stop=tuple(until)))
        self._answer(asked)
        return [r.text or "" for r in asked]
