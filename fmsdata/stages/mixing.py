"""Interleave several datasets' document streams so each gets its share of tokens.

The rule is deterministic and memoryless. Each dataset has a *target*: the tokens it
should have given by each clock value, the integral of its normalized weight over the
shard's clock (``fmsdata.stages.schedule.ShareTargets``; with constant weights, its share of the
clock). A document's key is the clock at which its dataset's target passes the document's
first token, and the next document is the one with the smallest key (ties to the dataset
listed first; a dataset whose target never passes it gives no more). So each dataset's
tokens stay within a document of its target however often a schedule changes the
weights, and shares follow the schedule's integral. The targets count from ``base``, the
tokens taken when the accounting (re)started: zero, or where a resume changed the mix.
Because each dataset's keys grow with every document it gives, the rule's output is the
sorted merge of per-dataset key sequences, so whole read-ahead blocks are merged with one sort.
A block is cut where the first dataset runs out of read-ahead, which makes the result the
same whatever the block sizes, and lets a resume from any consumed position continue
exactly.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.stages.base import DatasetRenumbering, Stage
from fmsdata.stages.documents import not_started
from fmsdata.stages.schedule import ShareTargets, WeightSchedule
from fmsdata.stages.source import Documents, DocumentSource
from fmsdata.util.compiled import compiled
from fmsdata.util.statecheck import need_count

__all__ = ["DatasetStreams", "TokenShareMixer"]


@dataclasses.dataclass
class _Ledger:
    """One mixed block's documents, by dataset and length, for committing any prefix of it
    (the block's own arrays: nothing is copied to keep it)."""

    ds: np.ndarray  # [rows] dataset of each document
    dlen: np.ndarray  # [rows] its decorated length
    used: int = 0


@compiled
def _range_totals(ds, dlen, begin, end, documents, tokens):  # type: ignore[no-untyped-def]
    """Documents and tokens of each dataset among rows ``begin .. end - 1``, added to
    ``documents`` and ``tokens``."""
    for i in range(begin, end):
        documents[ds[i]] += 1
        tokens[ds[i]] += dlen[i]


class DatasetStreams(Stage):
    """The mixer's input: one document source per dataset, each under its dataset's name
    (so ``walk``, ``settings`` and the saved-state hooks reach every stream). Holds no
    state of its own; on a change of the dataset list (``carry_over``) the kept datasets'
    streams go on, new ones start, removed ones are dropped."""

    def __init__(self, streams: Sequence[DocumentSource], names: Sequence[str]):
        self.streams = dict(zip(names, streams))

    def __next__(self) -> Any:
        raise TypeError("DatasetStreams is read by the mixer, one stream at a time")

    def children(self) -> dict[str, Stage]:
        return dict(self.streams)

    @classmethod
    def carry_over(
        cls, own: dict[str, Any], inputs: dict[str, Any], change: DatasetRenumbering
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """A new dataset's stream starts fresh (``not_started``: its stream, of whatever
        class, loads that as its ``fresh_state``)."""
        return own, {name: inputs.get(name, not_started()) for name in change.mix}


class TokenShareMixer(DocumentSource):
    """Mixes document sources (one per dataset) by token share: the document source the
    packer reads in the default chain (role ``"mixer"``).

    State keys: ``tokens`` and ``base`` (per dataset name: tokens taken in total, and the
    count the targets start from — zero, or the tokens taken where a resume changed the
    mix) and ``sources`` (the streams' states, by dataset name: ``DatasetStreams``).

    Args:
        streams: One document source per dataset, in config order.
        names: Dataset names, same order.
        schedule: Weights (non-negative, any scale) as a function of the shard's clock,
            the document tokens it has mixed.
    """

    role = "mixer"

    def __init__(
        self, streams: Sequence[DocumentSource], names: Sequence[str], schedule: WeightSchedule
    ):
        if len(streams) != len(names):
            raise ConfigError(
                f"the mixer needs one stream per dataset: {len(streams)} streams, "
                f"{len(names)} names"
            )
        self.streams = list(streams)
        self.names = list(names)
        self.sources = DatasetStreams(self.streams, self.names)
        self.schedule = schedule
        n = len(self.streams)
        self.tokens = [0] * n
        self.base = [0] * n
        self._ahead_tokens = [0] * n
        self._targets: tuple[list[int], ShareTargets] | None = None
        self._left: list[Documents] = [Documents.empty() for _ in range(n)]
        self._ledgers: collections.deque[_Ledger] = collections.deque()

    def children(self) -> dict[str, Stage]:
        return {"sources": self.sources}

    def read_ahead(self) -> Documents:
        """The next mixed documents after the read-ahead cursor (never empty)."""
        n = len(self.streams)
        targets = self._share_targets()
        ahead = self._ahead_tokens
        active = [d for d in range(n) if np.isfinite(targets.clock_at(d, ahead[d]))]
        for d in active:
            if not len(self._left[d]):
                self._left[d] = self.streams[d].read_ahead()
        take = [0] * n
        if len(active) == 1:
            take[active[0]] = len(self._left[active[0]])
            ds = np.full(take[active[0]], active[0], dtype=np.int64)
            order = None
        else:
            keys, ends = {}, {}
            for d in active:
                dlen = self._left[d].dlen
                csum = np.cumsum(dlen)
                keys[d] = targets.clock_at(d, ahead[d] + csum - dlen)
                ends[d] = float(targets.clock_at(d, ahead[d] + int(csum[-1])))
            # Cut where the first dataset's read-ahead ends: every document after that
            # could come later than one not read yet.
            cut = min(active, key=lambda d: (ends[d], d))
            end = ends[cut]
            for d in active:
                side: Literal["left", "right"] = "left" if d >= cut or end == np.inf else "right"
                take[d] = int(np.searchsorted(keys[d], end, side=side))
            ds = np.concatenate([np.full(take[d], d, dtype=np.int64) for d in active])
            order = np.lexsort((ds, np.concatenate([keys[d][: take[d]] for d in active])))
            ds = ds[order]
        merged = Documents.concat([self._left[d].take(0, take[d]) for d in active])
        if order is not None:
            merged = merged.select(order)
        merged.ds = ds  # the dataset's index in this mixer, whatever the stream says
        for d in active:
            if take[d]:
                self._ahead_tokens[d] += int(self._left[d].dlen[: take[d]].sum())
                self._left[d] = self._left[d].take(take[d])
        self._ledgers.append(self._ledger(ds, merged))
        return merged

    def _share_targets(self) -> ShareTargets:
        """Targets counted from ``base`` (kept until the base changes: a loaded state)."""
        if self._targets is None or self._targets[0] != self.base:
            self._targets = (list(self.base), self.schedule.targets(self.base))
        return self._targets[1]

    def _ledger(self, ds: np.ndarray, block: Documents) -> _Ledger:
        return _Ledger(ds, block.dlen.astype(np.int64, copy=False))

    def commit(self, rows: int) -> None:
        """Mark the next ``rows`` read-ahead documents as consumed."""
        n = len(self.streams)
        while rows:
            ledger = self._ledgers[0]
            take = min(rows, len(ledger.ds) - ledger.used)
            documents = np.zeros(n, dtype=np.int64)
            tokens = np.zeros(n, dtype=np.int64)
            _range_totals(
                ledger.ds, ledger.dlen, ledger.used, ledger.used + take, documents, tokens
            )
            for d, (used, taken) in enumerate(zip(documents.tolist(), tokens.tolist())):
                if used:
                    self.tokens[d] += taken
                    self.streams[d].commit(used)
            ledger.used += take
            if ledger.used == len(ledger.ds):
                self._ledgers.popleft()
            rows -= take

    def rewind(self) -> None:
        """Drop read-ahead: the next ``read_ahead`` starts at the consumed position."""
        self._ahead_tokens = list(self.tokens)
        self._left = [Documents.empty() for _ in self.streams]
        self._ledgers.clear()
        for stream in self.streams:
            stream.rewind()

    def prefetch_upcoming(self) -> None:
        for stream in self.streams:
            stream.prefetch_upcoming()

    # -- stage protocol ------------------------------------------------------------------

    def own_state(self) -> dict[str, Any]:
        return {
            "tokens": dict(zip(self.names, self.tokens)),
            "base": dict(zip(self.names, self.base)),
        }

    def load_own_state(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if not isinstance(value, dict) or set(value) != set(self.names):
                found = sorted(value) if isinstance(value, dict) else type(value).__name__
                raise StateMismatchError(
                    f"{key}: mixer state covers datasets {found}, the config has "
                    f"{sorted(self.names)}"
                )
        self.tokens = [need_count(state["tokens"][n], f"tokens.{n}") for n in self.names]
        self.base = [need_count(state["base"][n], f"base.{n}") for n in self.names]
        self.rewind()

    def settings(self) -> dict[str, Any]:
        return {"datasets": list(self.names)}

    @classmethod
    def report(cls, own: dict[str, Any]) -> dict[str, Any]:
        """Nothing of its own: each dataset's stream reports what was taken from it. Holds
        no spans: what is taken and not handed out is held below."""
        return {}

    @classmethod
    def carry_over(
        cls, own: dict[str, Any], inputs: dict[str, Any], change: DatasetRenumbering
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Datasets kept continue from their own counts, new ones start at zero, removed
        ones are dropped; with ``change.rebase`` every share is measured afresh from here
        (``base`` moves to the tokens taken), so new weights hold now."""
        tokens = {name: int(own["tokens"].get(name, 0)) for name in change.mix}
        base = (
            dict(tokens)
            if change.rebase
            else {name: int(own["base"].get(name, 0)) for name in change.mix}
        )
        return {"tokens": tokens, "base": base}, inputs
