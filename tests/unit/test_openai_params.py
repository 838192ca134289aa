"""The parameters of the OpenAI endpoints as pure logic (issue 23): the prompt forms and choice
order, OpenAI's limits, a chat request to a model without a chat template, and streamed text that
never releases the start of a stop string."""

from __future__ import annotations

import pytest

from launcher.config.serve import ServeConfig
from launcher.serve.codec import Codec
from launcher.serve.openai_errors import ApiError
from launcher.serve.openai_format import StreamText
from launcher.serve.openai_params import Limits, chat_job, completion_job

BYTES = Codec(None, None)
LIMITS = Limits(ServeConfig(max_new_tokens=8), "tiny", 16, 256)


def test_prompt_forms_and_choice_order() -> None:
    for prompt, ids in [
        ("ab", [[97, 98]]),
        (["ab", "c"], [[97, 98], [99]]),
        ([97, 98], [[97, 98]]),
        ([[97], [98, 99]], [[97], [98, 99]]),
    ]:
        job = completion_job({"prompt": prompt, "n": 2, "seed": 5}, BYTES, LIMITS, 0)
        assert job.prompts == ids
        requests = job.requests()
        assert [r.prompt_ids for r in requests] == [p for p in ids for _ in range(2)]
        assert [r.sampling.seed for r in requests[:2]] == [5, 6]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "ab", "stop": list("abcde")}, "stop"),
        ({"prompt": "ab", "n": 129}, "n"),
        ({"prompt": "ab", "logprobs": 6}, "logprobs"),
        ({"prompt": [[300]]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": "ab", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "ab", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "ab", "stream": True, "logprobs": 1}, "stream"),
        ({"prompt": "ab", "model": "other"}, "model"),
        ({"prompt": "ab\ud800"}, "prompt"),
    ],
)
def test_limits_are_refused_naming_the_parameter(body: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        completion_job(body, BYTES, LIMITS, 0)
    assert refused.value.param == param


def test_echo_allows_max_tokens_zero_and_chat_needs_a_template() -> None:
    job = completion_job({"prompt": "ab", "echo": True, "max_tokens": 0}, BYTES, LIMITS, 0)
    assert job.max_tokens == 0 and job.prompt_texts == ["ab"]
    with pytest.raises(ApiError) as refused:
        chat_job({"messages": [{"role": "user", "content": "hi"}]}, BYTES, LIMITS, 0)
    assert refused.value.code == "no_chat_template" and refused.value.status == 400


def test_streamed_text_holds_back_a_possible_stop_string() -> None:
    text = StreamText(BYTES, ("END",))
    assert text.advance(list(b"abcE")) == "abc"  # "E" may start "END"
    assert text.advance(list(b"abcEN")) == ""
    assert text.advance(list(b"abcENX")) == "ENX"  # it did not
    assert text.finish("abcENXy") == "y"
