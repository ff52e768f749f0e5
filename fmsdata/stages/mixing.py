"""Interleave several datasets' document streams so each gets its share of tokens.

The rule is deterministic and memoryless: the next document comes from the dataset with
the smallest ``(tokens_taken - base) / weight`` (ties to the dataset listed first). Because
each dataset's keys grow with every document it gives, the rule's output is the sorted
merge of per-dataset key sequences, so whole read-ahead blocks are merged with one sort.
A block is cut where the first dataset runs out of read-ahead, which makes the result the
same whatever the block sizes, and lets a resume from any consumed position continue
exactly.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError
from fmsdata.stages.base import check_keys
from fmsdata.stages.documents import DocBlock, DocumentStream

__all__ = ["MixedDocs", "TokenShareMixer"]

STATE_KEYS = ("tokens", "base", "sources")


@dataclasses.dataclass
class MixedDocs:
    """Read-ahead documents in mixed order."""

    ds: np.ndarray  # dataset index
    file: np.ndarray
    doc: np.ndarray
    dlen: np.ndarray
    base: np.ndarray

    def __len__(self) -> int:
        return len(self.doc)

    def tail(self, start: int) -> MixedDocs:
        return MixedDocs(*(getattr(self, f)[start:] for f in _MIXED_FIELDS))

    def then(self, other: MixedDocs) -> MixedDocs:
        """These documents followed by ``other``."""
        if not len(self):
            return other
        return MixedDocs(
            *(np.concatenate([getattr(self, f), getattr(other, f)]) for f in _MIXED_FIELDS)
        )

    @staticmethod
    def empty() -> MixedDocs:
        e = np.zeros(0, dtype=np.int64)
        return MixedDocs(e, e, e, e, e)


_MIXED_FIELDS = ("ds", "file", "doc", "dlen", "base")


@dataclasses.dataclass
class _Ledger:
    """Running per-dataset totals over one mixed block, for committing any prefix of it."""

    count: np.ndarray  # [rows, datasets] documents taken so far
    tokens: np.ndarray  # [rows, datasets] tokens taken so far
    last_gpos: np.ndarray  # [rows, datasets] walk position of the latest document taken
    used: int = 0


class TokenShareMixer:
    """Mixes document streams by token share.

    State keys: ``tokens`` and ``base`` (per dataset name: tokens taken in total, and the
    count the share is measured from — moved when weights change) and ``sources`` (each
    dataset's stream state, by name).

    Args:
        streams: One stream per dataset, in config order.
        names: Dataset names, same order.
        weights: Positive token shares, same order (any scale).
    """

    def __init__(
        self, streams: Sequence[DocumentStream], names: Sequence[str], weights: Sequence[float]
    ):
        if not (len(streams) == len(names) == len(weights)):
            raise ValueError("streams, names and weights must have the same length")
        self.streams = list(streams)
        self.names = list(names)
        self.weights = np.asarray(weights, dtype=np.float64)
        n = len(self.streams)
        self.tokens = [0] * n
        self.base = [0] * n
        self._ahead_tokens = [0] * n
        self._left: list[DocBlock] = [DocBlock.empty() for _ in range(n)]
        self._ledgers: collections.deque[_Ledger] = collections.deque()

    def read_ahead(self) -> MixedDocs:
        """The next mixed documents after the read-ahead cursor (never empty)."""
        n = len(self.streams)
        for d in range(n):
            if not len(self._left[d]):
                self._left[d] = self.streams[d].read_ahead()
        if n == 1:
            block = self._left[0]
            self._left[0] = DocBlock.empty()
            take = [len(block)]
            parts = [block]
            ds = np.zeros(len(block), dtype=np.int64)
        else:
            keys, ends = [], []
            for d in range(n):
                rel = self._ahead_tokens[d] - self.base[d]
                dlen = self._left[d].dlen
                csum = np.cumsum(dlen)
                keys.append((rel + csum - dlen) / self.weights[d])
                ends.append((rel + int(csum[-1])) / self.weights[d])
            cut = min(range(n), key=lambda d: (ends[d], d))
            take = [
                int(np.searchsorted(keys[d], ends[cut], side="left" if d >= cut else "right"))
                for d in range(n)
            ]
            parts = [self._left[d].take(0, take[d]) for d in range(n)]
            ds = np.concatenate([np.full(take[d], d, dtype=np.int64) for d in range(n)])
            order = np.lexsort((ds, np.concatenate([keys[d][: take[d]] for d in range(n)])))
            ds = ds[order]
            for d in range(n):
                self._left[d] = self._left[d].take(take[d])
        merged = DocBlock.concat(parts)
        if n > 1:
            merged = merged.select(order)
        for d in range(n):
            if take[d]:
                self._ahead_tokens[d] += int(parts[d].dlen.sum())
        self._ledgers.append(self._ledger(ds, merged))
        return MixedDocs(ds, merged.file, merged.doc, merged.dlen, merged.base)

    def _ledger(self, ds: np.ndarray, block: DocBlock) -> _Ledger:
        onehot = ds[:, None] == np.arange(len(self.streams))[None, :]
        count = np.cumsum(onehot, axis=0)
        tokens = np.cumsum(onehot * block.dlen[:, None], axis=0)
        last = np.maximum.accumulate(np.where(onehot, block.gpos[:, None], -1), axis=0)
        return _Ledger(count, tokens, last)

    def commit(self, rows: int) -> None:
        """Mark the next ``rows`` read-ahead documents as consumed."""
        n = len(self.streams)
        while rows:
            ledger = self._ledgers[0]
            take = min(rows, len(ledger.count) - ledger.used)
            end = ledger.used + take - 1
            # One row of per-dataset counters as Python ints: cheaper than indexing numpy
            # element by element.
            count, tokens, last = (
                a[end].tolist() for a in (ledger.count, ledger.tokens, ledger.last_gpos)
            )
            if ledger.used:
                count_before = ledger.count[ledger.used - 1].tolist()
                tokens_before = ledger.tokens[ledger.used - 1].tolist()
            else:
                count_before = tokens_before = [0] * n
            for d in range(n):
                used = count[d] - count_before[d]
                if used:
                    self.tokens[d] += tokens[d] - tokens_before[d]
                    self.streams[d].commit(last[d], used)
            ledger.used += take
            if ledger.used == len(ledger.count):
                self._ledgers.popleft()
            rows -= take

    def rewind(self) -> None:
        """Drop read-ahead: the next ``read_ahead`` starts at the consumed position."""
        self._ahead_tokens = list(self.tokens)
        self._left = [DocBlock.empty() for _ in self.streams]
        self._ledgers.clear()
        for stream in self.streams:
            stream.rewind()

    def state_dict(self) -> dict[str, Any]:
        return {
            "tokens": dict(zip(self.names, self.tokens)),
            "base": dict(zip(self.names, self.base)),
            "sources": {name: s.state_dict() for name, s in zip(self.names, self.streams)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_keys("mixer", state, STATE_KEYS)
        for key in STATE_KEYS:
            if set(state[key]) != set(self.names):
                raise StateMismatchError(
                    f"mixer state {key!r} covers datasets {sorted(state[key])}, "
                    f"the config has {sorted(self.names)}"
                )
        self.tokens = [int(state["tokens"][name]) for name in self.names]
        self.base = [int(state["base"][name]) for name in self.names]
        for name, stream in zip(self.names, self.streams):
            stream.load_state_dict(state["sources"][name])
        self.rewind()
