"""Keyed permutations of ``range(n)`` computed position by position.

Document and file order are pure functions of a key derived from (seed, dataset, logical
shard, epoch, ...). A few rounds of invertible integer mixing over the next power-of-two domain,
with cycle walking back into ``range(n)``, give a bijection whose value at any position costs a few
integer operations: no order is ever materialized, and resuming at position p
needs nothing but p.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from fmsdata.util.compiled import compiled

__all__ = ["derive_key", "permute", "Permutations", "hash_index", "hash_values"]

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


@compiled
def _mix(x):  # type: ignore[no-untyped-def]
    """``_mix_int`` on a uint64, in wrapping uint64 arithmetic."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@compiled
def _hash_range(key, start, count):  # type: ignore[no-untyped-def]
    """``hash_values`` of counters ``start .. start + count - 1`` (uint64 key and start):
    one compiled call, where numpy took ten passes (a shuffle buffer hashes every take)."""
    out = np.empty(count, np.uint64)
    for i in range(count):
        out[i] = _mix(key ^ _mix(start + np.uint64(i) + np.uint64(0x9E3779B97F4A7C15)))
    return out


def hash_values(key: int, start: int, count: int) -> list[int]:
    """``hash_index`` before the modulo, for counters ``start .. start + count - 1``:
    ``hash_values(k, c, 1)[0] % n == hash_index(k, c, n)``."""
    return hash_array(key, start, count).tolist()


def hash_array(key: int, start: int, count: int) -> np.ndarray:
    """``hash_values`` as a uint64 array (for compiled loops)."""
    return _hash_range(np.uint64(key & _MASK64), np.uint64(start & _MASK64), count)


@compiled
def _round_constants(sizes: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each permutation's domain bits and round constants (compiled: a walk builds many
    small permutation sets, and numpy's fixed cost per call was most of it).

    Returns ``(bits, table)``: ``bits[g]`` is ``int(sizes[g] - 1).bit_length()`` (0 for a
    size of 0 or 1); row g of ``table`` holds round r's (addend, odd multiplier), each
    below ``2**bits[g]``, in columns ``2r`` and ``2r + 1``: drawn from ``_mix_int`` of a
    state stepped by the golden-ratio constant from ``keys[g]``.
    """
    count = len(sizes)
    bits = np.zeros(count, np.uint64)
    table = np.zeros((count, 2 * _ROUNDS), np.uint64)
    one = np.uint64(1)
    step = np.uint64(0x9E3779B97F4A7C15)
    for g in range(count):
        rest = np.uint64(max(sizes[g] - 1, 0))
        width = np.uint64(0)
        while rest > 0:
            width += one
            rest >>= one
        bits[g] = width
        mask = (one << width) - one
        state = keys[g]
        for column in range(2 * _ROUNDS):
            x = _mix(state + step)
            state = x
            table[g, column] = (x & mask) | (one if column % 2 else np.uint64(0))
    return bits, table


class Permutations:
    """Many keyed permutations at once: permutation g is of ``range(sizes[g])`` with key
    ``keys[g]``. Round constants are derived once; applying is one compiled loop (``_apply``).

    Args:
        sizes: Size of each permuted range.
        keys: 64-bit key of each permutation (see ``derive_key``).
    """

    def __init__(self, sizes: Sequence[int] | np.ndarray, keys: Sequence[int] | np.ndarray):
        self.sizes = np.ascontiguousarray(sizes, dtype=np.int64)
        self._bits, self._table = _round_constants(self.sizes, np.asarray(keys, dtype=np.uint64))

    def apply(self, positions: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Element i is position ``positions[i]`` of permutation ``groups[i]``.

        Returns:
            int64 array of permuted values, the shape of ``positions``.
        """
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        groups = np.ascontiguousarray(groups, dtype=np.int64)
        return _apply(positions, groups, self.sizes, self._bits, self._table)


@compiled
def _apply(
    positions: np.ndarray,
    groups: np.ndarray,
    sizes: np.ndarray,
    bits: np.ndarray,
    table: np.ndarray,
) -> np.ndarray:
    """``Permutations.apply`` one element at a time (compiled): scramble the position
    within the next power-of-two domain, again while it lands outside ``range(n)`` (cycle
    walking; each domain is under twice its range, so about two passes)."""
    out = np.zeros(len(positions), np.int64)
    one = np.uint64(1)
    for i in range(len(positions)):
        g = groups[i]
        n = np.uint64(sizes[g])
        if n <= one:  # a range of one element maps to 0
            continue
        mask = (one << bits[g]) - one
        shift = (bits[g] + one) >> one
        x = np.uint64(positions[i])
        while True:
            for r in range(_ROUNDS):
                x = (x + table[g, 2 * r]) & mask
                x = (x * table[g, 2 * r + 1]) & mask
                x ^= x >> shift
            if x < n:
                break
        out[i] = np.int64(x)
    return out


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
    flat = positions.reshape(-1)
    groups = np.zeros(len(flat), dtype=np.int64)
    return Permutations([n], [key]).apply(flat, groups).reshape(positions.shape)
