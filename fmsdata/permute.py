"""Keyed permutations of ``range(n)`` computed position by position.

Document and file order are pure functions of a key derived from (seed, dataset, logical
shard, epoch, ...). A few rounds of invertible integer mixing over the next power-of-two domain,
with cycle walking back into ``range(n)``, give a bijection whose value at any position costs a few
vectorized integer operations: no order is ever materialized, and resuming at position p
needs nothing but p.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["derive_key", "permute", "hash_index"]

_ROUNDS = 4
_MASK64 = (1 << 64) - 1


def derive_key(*parts: object) -> int:
    """A 64-bit key from any tuple of ints and strings (stable across processes and runs)."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _mix_int(x: int) -> int:
    x &= _MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def hash_index(key: int, counter: int, n: int) -> int:
    """A stateless pseudo-random index in ``range(n)`` for the given key and counter."""
    return _mix_int(key ^ _mix_int(counter + 0x9E3779B97F4A7C15)) % n


def _rounds(key: int, bits: int) -> list[tuple[np.uint64, np.uint64]]:
    """Per-round (addend, odd multiplier) pairs for a key, each below ``2**bits``."""
    mask = (1 << bits) - 1
    out = []
    state = key
    for _ in range(_ROUNDS):
        state = _mix_int(state + 0x9E3779B97F4A7C15)
        addend = state & mask
        state = _mix_int(state + 0x9E3779B97F4A7C15)
        out.append((np.uint64(addend), np.uint64((state & mask) | 1)))
    return out


def _scramble(x: np.ndarray, bits: int, rounds: list[tuple[np.uint64, np.uint64]]) -> np.ndarray:
    """A bijection of ``range(2**bits)``: add, multiply by an odd number, xor-shift, per round."""
    mask = np.uint64((1 << bits) - 1)
    shift = np.uint64((bits + 1) // 2)
    for addend, multiplier in rounds:
        x = (x + addend) & mask
        x = (x * multiplier) & mask
        x ^= x >> shift
    return x


def permute(positions: np.ndarray, n: int, key: int) -> np.ndarray:
    """Map positions in ``range(n)`` through the keyed bijection of ``range(n)``.

    Args:
        positions: Integer array of positions, each in ``[0, n)``.
        n: Size of the permuted range.
        key: 64-bit key (see ``derive_key``).

    Returns:
        int64 array of the same shape: the permuted values, all distinct for distinct input.
    """
    positions = np.asarray(positions, dtype=np.int64)
    if n <= 1:
        return np.zeros_like(positions)
    bits = int(n - 1).bit_length()
    rounds = _rounds(key, bits)
    out = _scramble(positions.astype(np.uint64), bits, rounds)
    # Cycle walking: values that land outside range(n) are scrambled again until they
    # return; the domain is under 2n, so this takes about two passes.
    outside = np.flatnonzero(out >= np.uint64(n))
    while outside.size:
        out[outside] = _scramble(out[outside], bits, rounds)
        outside = outside[out[outside] >= np.uint64(n)]
    return out.astype(np.int64)
