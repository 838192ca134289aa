"""Tokens per second of preparing a data=hf jsonl corpus into its cache (issue 32), with 1 and 2
tokenizing processes (data.tokenize_workers), and 1 process with the tokenizer's own threads off.

The corpus (about 200 MB of JSON Lines, documents of Zipf-distributed made-up words) and a
byte-level BPE tokenizer (vocabulary 8,192, trained here on its first 2 MB) are written under
/tmp and deleted afterwards. Each configuration runs in a fresh process with a fresh cache
directory; the JSON-to-Arrow conversion by `datasets` (one process, the same for all) is timed
apart from the tokenization into the cache, and every cache is checked to be the same bytes.

    .venv/bin/python -m benchmarks.tokenize_scale [--mb 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys, time
from pathlib import Path
from launcher.config.data import DataConfig
from launcher.data.hf import cache_root, load_records, prepare

cfg = DataConfig(**json.loads(sys.argv[1]))
start = time.perf_counter()
records = len(load_records("data.path", Path(cfg.path), cfg, cache_root(cfg) / "hf"))
read = time.perf_counter() - start
start = time.perf_counter()
final, built = prepare("data.path", cfg.path, cfg)
took = time.perf_counter() - start
meta = json.loads((final / "meta.json").read_text())
print(json.dumps({"read_s": read, "tokenize_s": took, "records": records, "dir": str(final),
                  "tokens": meta["tokens"], "built": built}))
"""
RUNS = {
    "1 process": {"workers": 1, "env": {}},
    "1 process, tokenizer threads off": {"workers": 1, "env": {"TOKENIZERS_PARALLELISM": "false"}},
    "2 processes": {"workers": 2, "env": {}},
}


def write_corpus(path: Path, megabytes: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=int(n))) for n in rng.integers(2, 10, size=20_000)]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    written, docs = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < megabytes << 20:
            picks = rng.choice(len(words), size=(1000, 200), p=weights)
            for row, n in zip(picks, rng.integers(50, 200, size=1000), strict=True):
                line = json.dumps({"text": " ".join(words[i] for i in row[:n])}) + "\n"
                f.write(line)
                written += len(line)
                docs += 1
    return docs


def train_tokenizer(corpus: Path, directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if sum(map(len, texts)) > 2 << 20:
                break
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<unk>", "</s>"])
    tok.train_from_iterator(texts, trainer)
    directory.mkdir(parents=True)
    tok.save(str(directory / "tokenizer.json"))


def digest(directory: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(directory.iterdir()):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tokenize-scale-") as tmp:
        root = Path(tmp)
        if shutil.disk_usage(tmp).free < 10 * (args.mb << 20):
            raise SystemExit(f"{tmp}: not enough free disk for {args.mb} MB and its caches")
        corpus = root / "corpus.jsonl"
        docs = write_corpus(corpus, args.mb)
        train_tokenizer(corpus, root / "tok")
        size = corpus.stat().st_size
        print(f"corpus: {size / 1e6:.0f} MB, {docs:,} documents", flush=True)
        results, digests = {}, set()
        for name, run in RUNS.items():
            cfg = {"name": "hf", "path": str(corpus), "tokenizer": str(root / "tok")}
            cfg |= {"cache_dir": str(root / f"cache-{len(results)}")}
            cfg |= {"tokenize_workers": run["workers"]}
            env = {**os.environ, **run["env"]}
            out = subprocess.run(
                [sys.executable, "-c", CHILD, json.dumps(cfg)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
            assert got["built"]
            got["tokens_per_s"] = got["tokens"] / got["tokenize_s"]
            got["mb_per_s"] = size / 1e6 / got["tokenize_s"]
            digests.add(digest(Path(got.pop("dir"))))
            results[name] = got
            print(f"{name}: {got}", flush=True)
            shutil.rmtree(root / f"cache-{len(results) - 1}")
        assert len(digests) == 1, "the caches differ"
    print("| tokenizing | JSON to Arrow | tokenize into the cache | tokens/s | MB/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        print(
            f"| {name} | {r['read_s']:.1f} s | {r['tokenize_s']:.1f} s | "
            f"{r['tokens_per_s']:,.0f} | {r['mb_per_s']:.1f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
