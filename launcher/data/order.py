"""The sample order within an epoch: a keyed bijection of [0, N), computed, not stored.

`FeistelOrder` (data.order=feistel, the default) maps position i of epoch e to sample
`permute(i)`, where `permute` is a Feistel-style network over the k bits of the next power of two
2^k >= N, keyed by (seed, epoch), with cycle-walking: a value that lands at or past N is sent
through the network again until it lands below N. Each round replaces one half of the bits by
itself XOR a keyed hash of the other half; each round is its own inverse given the other half,
so the network is a bijection of [0, 2^k), and cycle-walking a bijection of [0, N) (the walk from
an in-range value follows its cycle of the network and stops at the next in-range value, and
distinct starts reach distinct ends). The walk takes fewer than 2 rounds of the network on
average (2^k < 2N). Everything is numpy arithmetic on uint64 arrays of positions: a global batch
costs microseconds and the order costs a few hundred bytes (the round keys) at any N.

`RandpermOrder` (data.order=randperm) is the order every run used before order versions were
recorded: torch.randperm(N) per epoch, held as a list on every rank (8 bytes and more per sample).
It stays, named, so that those runs' checkpoints resume bitwise as before.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

ROUNDS = 6
"""Feistel rounds (each one half of the bits): enough mixing for a data order (not a cipher)."""

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wraps modulo 2^64, as intended)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _M1
        x = x ^ (x >> np.uint64(27))
        x = x * _M2
        return x ^ (x >> np.uint64(31))


def _mix_int(value: int) -> int:
    return int(mix64(np.array([value & _MASK64], dtype=np.uint64))[0])


def stable_key(*parts: int | str) -> int:
    """A 64-bit key from integers and names, the same on every machine and Python version
    (no `hash()`, which is salted per process for strings)."""
    key = 0
    for part in parts:
        if isinstance(part, str):
            part = int.from_bytes(hashlib.blake2b(part.encode(), digest_size=8).digest(), "little")
        key = _mix_int(key * _GOLDEN + (part & _MASK64) + 1)
    return key


class FeistelOrder:
    """Epoch after epoch of a keyed permutation of [0, n): `samples(positions)`."""

    version = "feistel-v1"

    def __init__(self, n: int, seed: int, stream: int | str = 0) -> None:
        """stream: keeps the orders of several sources of one run apart (their names)."""
        if n < 1:
            raise ValueError(f"an order needs at least one sample, got {n}")
        self.n, self.seed, self.stream = n, seed, stream
        self.bits = max(0, (n - 1).bit_length())
        self.low = self.bits // 2  # the right half's width; the left half takes the rest
        self._keys: dict[int, np.ndarray] = {}

    def _round_keys(self, epoch: int) -> np.ndarray:
        keys = self._keys.get(epoch)
        if keys is None:
            base = stable_key(self.seed, self.stream, epoch)
            keys = np.array([stable_key(base, r) for r in range(ROUNDS)], dtype=np.uint64)
            self._keys = {epoch: keys}  # one epoch at a time: memory stays flat
        return keys

    def _network(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        low = np.uint64(self.low)
        low_mask = np.uint64((1 << self.low) - 1)
        high_mask = np.uint64((1 << (self.bits - self.low)) - 1)
        left, right = x >> low, x & low_mask
        for r in range(ROUNDS):
            if r % 2 == 0:  # the left half takes a hash of the right
                left = left ^ (mix64(right ^ keys[r]) & high_mask)
            else:
                right = right ^ (mix64(left ^ keys[r]) & low_mask)
        return (left << low) | right

    def permute(self, offsets: np.ndarray, epoch: int) -> np.ndarray:
        """The samples at `offsets` (each in [0, n)) of epoch `epoch`."""
        x = np.asarray(offsets, dtype=np.uint64)
        if self.bits == 0:
            return x.astype(np.int64)
        keys, n = self._round_keys(epoch), np.uint64(self.n)
        x = self._network(x, keys)
        out = x >= n
        while out.any():  # cycle-walking: fewer than 2 passes on average
            x[out] = self._network(x[out], keys)
            out[out] = x[out] >= n
        return x.astype(np.int64)

    def samples(self, positions: np.ndarray) -> np.ndarray:
        """Samples at positions of the endless order (epoch = position // n)."""
        positions = np.asarray(positions, dtype=np.int64)
        epochs, offsets = np.divmod(positions, self.n)
        out = np.empty_like(positions)
        for epoch in np.unique(epochs):  # a batch spans one epoch, or two at a boundary
            where = epochs == epoch
            out[where] = self.permute(offsets[where], int(epoch))
        return out


class RandpermOrder:
    """The order before order versions were recorded: torch.randperm per epoch (O(N) memory)."""

    version = "randperm"

    def __init__(self, n: int, seed: int, stream: int | str = 0) -> None:
        del stream  # one source only (data.sources needs data.order=feistel)
        self.n, self.seed = n, seed
        self._epoch = -1
        self._perm: list[int] = []

    def _position(self, p: int) -> int:
        epoch, offset = divmod(p, self.n)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.n, generator=g).tolist()
            self._epoch = epoch
        return self._perm[offset]

    def samples(self, positions: np.ndarray) -> np.ndarray:
        return np.array([self._position(int(p)) for p in positions], dtype=np.int64)


ORDERS = {"feistel": FeistelOrder, "randperm": RandpermOrder}
"""data.order's values and the orders they name."""
