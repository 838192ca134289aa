"""Tokenizing records in worker processes. A floor of its own, below `data`, and light: a pool's
process (started with `spawn`) imports numpy and the tokenizer's library, never torch."""
