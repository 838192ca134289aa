"""Make this project's data: a small text corpus, a tokenizer trained on it, and token files.

    python prepare.py            # writes data/ (about 70 KB; needs `pip install tokenizers`)

What it writes, all under data/:
  corpus.jsonl, val.jsonl   the training and held-out text, one {"text": ...} document per line
                            (data=hf reads them too), generated from a small grammar with a fixed
                            seed: there is something to learn, and every run writes the same files
  tokenizer/tokenizer.json  a byte-level BPE tokenizer (tokenizers library) trained on corpus.txt
  train.bin, val.bin        the documents tokenized, each followed by <|endoftext|>, as one flat
                            array of uint16 token ids (the nanoGPT/Megatron format of data=tokens)

The vocabulary size it prints is what conf/model/my_net.yaml's vocab_size must be at least.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

EOS = "<|endoftext|>"
VOCAB_SIZE = 512

# The words of the grammar: one line per kind, alternatives separated by "|".
WORDS = """
subject: the cat | a small dog | the old sailor | my sister | the baker | a tired student |
    the quiet river | our neighbour | the red fox | a young painter | the farmer | the teacher |
    a curious child | the captain | the gardener | an owl
verb: watched | painted | carried | found | followed | remembered | counted | cleaned | opened |
    visited | forgot | mended | described | admired | lost | sold
object: the lantern | a wooden boat | the garden gate | three apples | an old map |
    the bright kitchen | a letter | the narrow bridge | two blue cups | the harbour |
    a basket of bread | the stone wall | a silver key | the long road | the morning paper
place: near the sea | in the village | before dinner | after the rain | at the market |
    under the trees | by the window | on a cold morning | in the evening | at the station
link: and then | because | while | so | but later
"""
KINDS = {
    kind.strip(): [w.strip() for w in words.split("|")]
    for kind, words in (
        part.split(":") for part in WORDS.replace("\n    ", " ").strip().split("\n")
    )
}
SUBJECTS, VERBS, OBJECTS = KINDS["subject"], KINDS["verb"], KINDS["object"]
PLACES, LINKS = KINDS["place"], KINDS["link"]


def sentence(rng: random.Random) -> str:
    words = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    if rng.random() < 0.6:
        words += f" {rng.choice(PLACES)}"
    if rng.random() < 0.3:
        words += f" {rng.choice(LINKS)} {rng.choice(SUBJECTS)} {rng.choice(VERBS)} it"
    return words[0].upper() + words[1:] + "."


def documents(rng: random.Random, count: int) -> list[str]:
    return [" ".join(sentence(rng) for _ in range(rng.randint(2, 6))) for _ in range(count)]


def train_tokenizer(texts: list[str], vocab_size: int):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def token_ids(tokenizer, texts: list[str]) -> np.ndarray:  # type: ignore[no-untyped-def]
    eos = tokenizer.token_to_id(EOS)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids.extend(encoding.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--docs", type=int, default=120, help="training documents")
    parser.add_argument("--val-docs", type=int, default=20, help="held-out documents")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    train, val = documents(rng, args.docs), documents(rng, args.val_docs)
    out = args.out
    (out / "tokenizer").mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in train))
    (out / "val.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in val))

    tokenizer = train_tokenizer(train, VOCAB_SIZE)
    tokenizer.save(str(out / "tokenizer" / "tokenizer.json"))
    for name, texts in (("train.bin", train), ("val.bin", val)):
        ids = token_ids(tokenizer, texts)
        ids.tofile(out / name)
        print(f"{out / name}: {len(ids):,} tokens")
    print(
        f"vocabulary: {tokenizer.get_vocab_size()} tokens (model.vocab_size must be at least this)"
    )


if __name__ == "__main__":
    main()
