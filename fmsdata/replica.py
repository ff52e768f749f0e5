"""The main process's replica of what was consumed: each shard's state as of the last
batch handed to the caller.

Workers run ahead of the training loop; the main process keeps a ``ConsumedState`` that
it advances with what the workers send (round-end shard states and the shuffle-buffer
journal, plus the lines consumed since), so a saved state describes exactly the batches
handed to the caller (``fmsdata.loaderstate`` writes it).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fmsdata.bufferreplica import BufferReplica
from fmsdata.loaderstate import ShardEntry
from fmsdata.stages.savedlines import SavedLines, pack_lines, unpack_lines
from fmsdata.stages.shuffle import BUFFER_KEY
from fmsdata.statecheck import fail, within
from fmsdata.transport import ShardLights, WorkerItem

__all__ = ["ConsumedState", "journal_path"]


def journal_path(stages: Sequence[Mapping[str, Any]]) -> tuple[str, ...] | None:
    """Where the journaled shuffle buffer's own state sits in a shard state: the first
    stage of the recorded chain (``fmsdata.stages.base.layout``) whose role is
    ``"shuffle"``, as ``ShardPipeline`` journals it; None when the chain has none."""
    for stage in stages:
        if stage.get("role") == "shuffle" and stage.get("path") is not None:
            return ("stages", *stage["path"])
    return None


class ConsumedState:
    """Per-shard pipeline state as of the last batch handed to the caller.

    Each shard is described by a state it passed through (``light`` + the journaled
    shuffle buffer, kept here as line numbers: ``fmsdata.bufferreplica``) and the number
    of lines it emitted since (``advance``); a shard's state moves forward when a worker
    item that advanced it has been consumed completely. The light states stay as the
    items brought them (``ShardLights``), unpickled only when a state is read, and the
    per-item work is a few array operations and one compiled journal replay: what the
    main process spends per batch does not grow with the lines or shards of an item.

    Args:
        shard_ids: This rank's logical shards.
        stages: The chain as the state fingerprint records it (``stages`` there): where
            the journaled shuffle buffer's state sits (``journal_path``).
        entries: Saved ``{shard id: ShardEntry}`` (absent: not started).
        steps: Batches consumed before (skipped ones included).
        skips: ``[step, batches]`` of every skip so far.

    Raises:
        StateMismatchError: A saved shard state has no readable shuffle buffer where the
            chain journals one (named by the entry's path).
    """

    def __init__(
        self,
        shard_ids: Sequence[int],
        stages: Sequence[Mapping[str, Any]],
        entries: Mapping[int, ShardEntry] | None = None,
        steps: int = 0,
        skips: Sequence[Sequence[int]] = (),
    ):
        self.shard_ids = list(shard_ids)
        self.steps = steps
        self.skips = [[int(at), int(n)] for at, n in skips]
        self.buffer_path = journal_path(stages)
        # A loaded state's light part, or the item whose lights hold the shard's.
        self._light: dict[int, dict[str, Any] | ShardLights | None] = {}
        self._saved: dict[int, SavedLines] = {}  # the buffer each shard resumed with
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
            if entry.state is None:
                self._light[sid] = None
                continue
            state = entry.state
            if self.buffer_path is not None:
                with within(entry.path or f"logical shard {sid}"):
                    state, saved = self._split_buffer(state)
                self._saved[sid] = saved
            self._light[sid] = copy.deepcopy(state)
        self._buffers = BufferReplica(
            self.shard_ids, {sid: len(saved) for sid, saved in self._saved.items()}
        )

    def _split_buffer(self, state: Mapping[str, Any]) -> tuple[dict[str, Any], SavedLines]:
        """A shard state less its journaled buffer, and the buffer's lines. Shallow copies
        down to the buffer: the deep copy of the rest never copies the buffered spans."""
        assert self.buffer_path is not None
        out = dict(state)
        node = out
        for i, key in enumerate(self.buffer_path):
            inner = node.get(key)
            if not isinstance(inner, Mapping):
                raise fail(".".join(self.buffer_path[:i]), f"keys missing [{key!r}]")
            node[key] = dict(inner)
            node = node[key]
        if BUFFER_KEY not in node:
            raise fail(".".join(self.buffer_path), f"shuffle state: keys missing [{BUFFER_KEY!r}]")
        with within(".".join((*self.buffer_path, BUFFER_KEY))):
            return out, unpack_lines(node.pop(BUFFER_KEY))

    def consume_batch(self, items: Sequence[WorkerItem], batch: int) -> None:
        """Count the lines of batch ``batch`` of ``items`` (the current items, one per
        worker, consumed together) as consumed. Consecutive batches are counted together
        when the counts are next read (once for a run of batches, not per batch or per
        worker: the main process's cost per batch stays constant)."""
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
        first line; the state they send with the shard's next item includes them."""
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
        """Where ``item`` (its batches counted) ends a round
        (``fmsdata.transport.item_rounds``), move the shards the round advanced to their
        state at its end. Lines skipped past the item's end stay counted."""
        lights = item.lights
        self._light.update(dict.fromkeys(lights.shards, lights))
        self._buffers.apply(item.ops, item.pushed, item.pushed_offsets)
        if not lights.shards:  # an item inside a round: its lines stay an advance
            return
        shards = np.fromiter(lights.shards, dtype=np.int64, count=len(lights.shards))
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
            light = self._light_state(sid)
            emitted = int(self._advance[sid])
            counts.append(emitted + (0 if light is None else int(light["emitted"])))
        return counts

    def _light_state(self, sid: int) -> dict[str, Any] | None:
        light = self._light[sid]
        return light.get(sid) if isinstance(light, ShardLights) else light

    def shard_state(self, sid: int) -> dict[str, Any] | None:
        light = self._light_state(sid)
        if light is None:
            return None
        if self.buffer_path is None:
            return light
        # Copy the dicts on the way to the buffer only: the rest is shared, read-only.
        state = dict(light)
        node = state
        for key in self.buffer_path:
            node[key] = dict(node[key])
            node = node[key]
        node[BUFFER_KEY] = pack_lines(self._buffers.lines(sid), self._saved.get(sid))
        return state

    def shard_states(self) -> dict[int, Any]:
        return {sid: self.shard_state(sid) for sid in self.shard_ids}

    def advances(self) -> dict[int, int]:
        self._count_all()
        advance = self._advance.tolist()
        return {sid: advance[sid] for sid in self.shard_ids}
