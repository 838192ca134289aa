"""model.vocab_size=auto (the default of the built-in models): the tokenizer's vocabulary with
data=hf, else the bytes' 256; model=hf from a config follows the tokenizer when given none
(issue 33, item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.data import DataConfig, DataKind
from launcher.config.model import HF_TARGET, ModelConfig, UserModelConfig
from launcher.config.root import RootConfig
from launcher.data.vocab import follow_tokenizer, vocab_source
from launcher.errors import ConfigError

TOKENIZER = Path(__file__).resolve().parents[2] / "examples" / "own_project" / "data" / "tokenizer"
HF = DataConfig(name=DataKind.hf, path="corpus.jsonl", tokenizer=str(TOKENIZER))


def test_auto_without_a_tokenizer_is_the_bytes() -> None:
    cfg = RootConfig()
    assert cfg.model.vocab_size == 256  # resolved with the config: config.yaml holds 256
    assert RootConfig(model=ModelConfig(vocab_size=1000)).model.vocab_size == 1000
    with pytest.raises(ConfigError) as err:
        RootConfig(model=ModelConfig(vocab_size=100))  # the reversal task is bytes
    assert err.value.keys == ["model.vocab_size"]
    tokens = DataConfig(name=DataKind.tokens, path="x.bin")
    assert RootConfig(model=ModelConfig(vocab_size=100), data=tokens).model.vocab_size == 100
    for bad in ("lots", 0, 2.5, True):
        with pytest.raises(ConfigError, match=r"model\.vocab_size"):
            ModelConfig(vocab_size=bad)


def test_the_builtin_model_follows_the_tokenizer() -> None:
    cfg = RootConfig(data=HF)
    assert cfg.model.vocab_size == "auto"  # until the data is prepared
    followed = follow_tokenizer(cfg)
    assert followed.model.vocab_size == 512
    assert vocab_source(followed, 512) == "data.tokenizer"
    given = follow_tokenizer(RootConfig(data=HF, model=ModelConfig(vocab_size=600)))
    assert given.model.vocab_size == 600 and vocab_source(given, 600) == "model.vocab_size"


def _user(target: str, **kwargs: object) -> UserModelConfig:
    return UserModelConfig(_target_=target, kwargs=dict(kwargs))


@pytest.mark.parametrize(
    ("model", "data", "vocab"),
    [
        (_user(HF_TARGET, config="tiny.json"), HF, 512),  # unset: the tokenizer's
        (_user(HF_TARGET, config="tiny.json", vocab_size="auto"), HF, 512),
        (_user(HF_TARGET, config="tiny.json", vocab_size=600), HF, 600),  # the user's number
        (_user(HF_TARGET, path="ckpt"), HF, None),  # trained weights keep their own
        (_user(HF_TARGET, config="tiny.json"), DataConfig(), None),  # no tokenizer: the config's
        (_user("pkg.Net"), HF, None),  # a user model whose arguments say nothing
        (_user("pkg.Net", vocab_size="auto"), HF, 512),
        (_user("pkg.Net", vocab_size="auto"), DataConfig(), 256),
    ],
)
def test_user_models_follow_when_they_give_no_vocabulary(
    model: UserModelConfig, data: DataConfig, vocab: int | None
) -> None:
    followed = follow_tokenizer(RootConfig(model=model, data=data))
    assert isinstance(followed.model, UserModelConfig)
    assert followed.model.kwargs.get("vocab_size") == (vocab or model.kwargs.get("vocab_size"))
