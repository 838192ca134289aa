"""`launch export` writes the run's tokenizer whole: every special token (bos, eos, unk, pad,
additional) and the chat template it had, whether transformers saved it (tokenizer_config.json,
chat_template.jinja) or it is a bare tokenizer.json (issue 36: only the EOS survived)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.export.weights import write_tokenizer
from tests.data_sources import train_tokenizer
from tests.installed import require

require("transformers")

TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
SPECIAL = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
    "additional_special_tokens": ["<tool>"],
}


def _saved_by_transformers(root: Path, jinja: bool) -> Path:
    """A tokenizer as transformers saves one: special tokens and a chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    bare = train_tokenizer(root / "bare")
    backend = Tokenizer.from_file(str(bare / "tokenizer.json"))
    backend.add_special_tokens(["<s>", "<pad>", "<tool>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **SPECIAL)  # type: ignore[arg-type]
    tok.chat_template = TEMPLATE
    saved = root / "saved"
    tok.save_pretrained(str(saved))
    config = json.loads((saved / "tokenizer_config.json").read_text())
    has_jinja = (saved / "chat_template.jinja").is_file()
    if jinja and not has_jinja:  # the newer layout: the template in its own file
        (saved / "chat_template.jinja").write_text(config.pop("chat_template"))
    if not jinja and has_jinja:  # the older layout: inside tokenizer_config.json
        config["chat_template"] = (saved / "chat_template.jinja").read_text()
        (saved / "chat_template.jinja").unlink()
    (saved / "tokenizer_config.json").write_text(json.dumps(config))
    return saved


@pytest.mark.parametrize("jinja", [False, True], ids=["config", "jinja"])
def test_export_keeps_every_special_token_and_the_chat_template(
    tmp_path: Path, jinja: bool
) -> None:
    source = _saved_by_transformers(tmp_path, jinja)
    export = tmp_path / "export"
    export.mkdir()
    write_tokenizer(str(source), None, export)
    from transformers import AutoTokenizer

    run, exported = (
        AutoTokenizer.from_pretrained(str(source)),
        AutoTokenizer.from_pretrained(str(export)),
    )
    assert run.chat_template == TEMPLATE and exported.chat_template == run.chat_template
    assert exported.special_tokens_map == run.special_tokens_map
    assert exported.all_special_ids == run.all_special_ids
    assert exported.bos_token == "<s>" and exported.pad_token == "<pad>"
    text = "the cat sat"
    assert exported(text)["input_ids"] == run(text)["input_ids"]
    messages = [{"role": "user", "content": "hi"}]
    assert exported.apply_chat_template(messages, tokenize=False) == run.apply_chat_template(
        messages, tokenize=False
    )


def test_a_bare_tokenizer_json_gets_the_runs_eos_and_the_runs_template(tmp_path: Path) -> None:
    source = train_tokenizer(tmp_path / "bare")
    export = tmp_path / "export"
    export.mkdir()
    write_tokenizer(str(source), "</s>", export, chat_template=TEMPLATE)
    from transformers import AutoTokenizer

    exported = AutoTokenizer.from_pretrained(str(export))
    assert exported.eos_token == "</s>" and exported.chat_template == TEMPLATE
