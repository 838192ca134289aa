"""Run in a fresh Python process by test_export.py: load each export the way a user of
transformers does, and write its logits on the given ids and its tokenizer's ids of a text.

usage: python -m tests.e2e.export_probe OUT.pt TEXT EXPORT_DIR...
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(out: str, text: str, directories: list[str]) -> None:
    torch.set_num_threads(1)
    ids = torch.arange(24).remainder(100).view(2, 12)
    results = {}
    for directory in directories:
        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        with torch.no_grad():
            logits = model(ids).logits
        dtype = next(model.parameters()).dtype
        encoded = tokenizer(text, add_special_tokens=False)["input_ids"]
        results[directory] = {"logits": logits, "dtype": str(dtype), "ids": encoded}
    torch.save({"input": ids, "results": results}, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
