"""What the main process knows was consumed: each shard's state as of the last batch
handed to the caller.

Workers run ahead of the training loop. Each sends, with the last item of a round
(``fmsdata.transport.rounds.item_rounds``), the whole state of every shard the round advanced,
as one opaque blob (``ShardStates``, unpickled only when a state is read). The main
process keeps, per shard, the latest such state whose lines are all consumed, plus the
number of lines consumed since (``advance``). A saved state is exactly that pair; a resume
replays the ``advance`` lines at span level (``fmsdata.worker.chain.open_shard``). The main
process never runs a stage's logic to mirror its state.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fmsdata.state.format import ShardEntry
from fmsdata.transport.items import ShardStates, WorkerItem

__all__ = ["ConsumedState"]


class ConsumedState:
    """Per-shard pipeline state as of the last batch handed to the caller.

    Each shard is described by a state it passed through and the number of lines it
    emitted since (``advance``); a shard's state moves forward when a worker item that
    carries its round-end state has been consumed completely. The per-batch work is one
    array addition per run of consecutive batches, whatever the lines or shards of an
    item.

    Args:
        shard_ids: This rank's logical shards.
        entries: Saved ``{shard id: ShardEntry}`` (absent: not started).
        steps: Batches consumed before (skipped ones included).
        skips: ``[step, batches]`` of every skip so far.
    """

    def __init__(
        self,
        shard_ids: Sequence[int],
        entries: Mapping[int, ShardEntry] | None = None,
        steps: int = 0,
        skips: Sequence[Sequence[int]] = (),
    ):
        self.shard_ids = list(shard_ids)
        self.steps = steps
        self.skips = [[int(at), int(n)] for at, n in skips]
        # A loaded state, or the blob of the round-end states that holds the shard's.
        self._state: dict[int, dict[str, Any] | ShardStates | None] = {}
        # Per shard id (arrays: an item's counts are added in one operation).
        size = max(self.shard_ids) + 1 if self.shard_ids else 0
        self._advance = np.zeros(size, dtype=np.int64)
        self._replayed = np.zeros(size, dtype=np.int64)  # see workers_start
        # Batches consumed but not counted in _advance yet: [items, a, b].
        self._run: list[Any] | None = None
        # Where each loaded shard state sat in what was loaded (its checks name it).
        self.paths = {sid: e.path for sid, e in (entries or {}).items() if e.path}
        for sid in self.shard_ids:
            entry = (entries or {}).get(sid) or ShardEntry(sid, None)
            self._advance[sid] = entry.advance
            self._state[sid] = copy.deepcopy(entry.state)

    def consume_batch(self, items: Sequence[WorkerItem], batch: int) -> None:
        """Count the lines of batch ``batch`` of ``items`` (the current items, one per
        worker, consumed together) as consumed. Consecutive batches are counted together
        when the counts are next read (once for a run of batches, not per batch or per
        worker)."""
        run = self._run
        if run is not None and run[0] is items and run[2] == batch:
            run[2] = batch + 1
            return
        self._count_all()
        self._run = [items, batch, batch + 1]

    def _count_all(self) -> None:
        """Add the lines of the run ``[items, first batch, end batch]`` not counted yet."""
        run = self._run
        if run is None:
            return
        items, a, b = run
        for item in items:
            lines = item.row_shards[item.offsets[a] : item.offsets[b]]
            if len(lines):
                self._advance += np.bincount(lines, minlength=len(self._advance))
        run[1] = b

    def workers_start(self) -> dict[int, int]:
        """Lines past each shard's state that workers starting now replay before their
        first line; the state they send with the shard's next round includes them."""
        self._count_all()
        self._run = None  # the items of the last workers: counted, never finished
        self._replayed = self._advance.copy()
        return self.advances()

    def finish_items(self, items: Sequence[WorkerItem]) -> None:
        """Count ``items`` (the current items, one per worker) as consumed, every batch
        of them consumed or skipped (``finish_item``)."""
        if self._run is not None and self._run[0] is items:
            self._count_all()
            self._run = None
        for item in items:
            self.finish_item(item)

    def finish_item(self, item: WorkerItem) -> None:
        """Where ``item`` (its batches counted) ends a round, move the shards the round
        advanced to their state at its end. Lines skipped past the item's end stay
        counted."""
        states = item.states
        if not states.shards:  # an item inside a round: its lines stay an advance
            return
        self._state.update(dict.fromkeys(states.shards, states))
        shards = np.fromiter(states.shards, dtype=np.int64, count=len(states.shards))
        self._advance[shards] -= self._replayed[shards] + item.state_lines
        self._replayed[shards] = 0

    def advance_by(self, lines: Mapping[int, int]) -> None:
        """Count lines as consumed without their batches (a skip)."""
        for sid, n in lines.items():
            self._advance[sid] += n

    def emitted(self) -> list[int]:
        """Lines consumed so far from each of the rank's shards, in shard order."""
        self._count_all()
        counts = []
        for sid in self.shard_ids:
            state = self.shard_state(sid)
            emitted = int(self._advance[sid])
            counts.append(emitted + (0 if state is None else int(state["emitted"])))
        return counts

    def shard_state(self, sid: int) -> dict[str, Any] | None:
        """Shard ``sid``'s state (shared: read it, do not change it), or None: not started."""
        state = self._state[sid]
        return state.get(sid) if isinstance(state, ShardStates) else state

    def shard_states(self) -> dict[int, Any]:
        return {sid: self.shard_state(sid) for sid in self.shard_ids}

    def advances(self) -> dict[int, int]:
        self._count_all()
        advance = self._advance.tolist()
        return {sid: advance[sid] for sid in self.shard_ids}
