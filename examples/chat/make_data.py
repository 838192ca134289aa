"""Write the files of docs/data.md's conversation example into this directory (nothing is
downloaded): a small BPE tokenizer with ChatML's special tokens, a ChatML chat template, and
conversations.jsonl where the assistant repeats the user's words in reverse.

    python examples/chat/make_data.py      # (re)writes tokenizer/, chat_template.jinja,
                                           # conversations.jsonl beside this file
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "dog",
    "ran",
    "to",
    "big",
    "red",
    "barn",
    "while",
    "birds",
    "sang",
]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 11)))


def main() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(0)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "</s>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=128, special_tokens=special)
    texts = [sentence(rng) for _ in range(400)] + ["user assistant system"]
    tok.train_from_iterator(texts, trainer)
    (HERE / "tokenizer").mkdir(exist_ok=True)
    tok.save(str(HERE / "tokenizer" / "tokenizer.json"))
    (HERE / "chat_template.jinja").write_text(TEMPLATE)
    lines = []
    for i in range(256):
        messages = [{"role": "system", "content": "reverse the words"}] if i % 3 == 0 else []
        for _ in range(rng.randint(1, 3)):
            said = sentence(rng)
            messages.append({"role": "user", "content": said})
            messages.append({"role": "assistant", "content": " ".join(said.split()[::-1])})
        lines.append(json.dumps({"messages": messages}))
    (HERE / "conversations.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
