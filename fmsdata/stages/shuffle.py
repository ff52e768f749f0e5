"""A shuffle buffer over packed lines, held as spans.

The buffer fills two lines per step until it holds ``window`` lines, then one per step;
each step hands out the line at a stateless pseudo-random slot (a hash of the shard key
and the step count), so the only randomness state is the step count. Lines are spans,
so the saved buffer is a few integers per line however long the lines are.

Every change to the buffer of the chain's *journaled* shuffle buffer (the first in the
chain, see ``fmsdata.pipeline``) is also recorded in a journal — an op list where ``-1`` means
"push the next recorded line" and ``k >= 0`` "take the line at slot k", plus the pushed
lines: a DataLoader worker forwards the journal with each batch, and the main process
replays it on a copy of the buffer to know the state of what was *consumed* without the
worker sending the whole buffer each time (see ``fmsdata.state``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError
from fmsdata.permute import hash_values
from fmsdata.stages.base import (
    LENGTH,
    SAVED_SPAN_WIDTH,
    DatasetRenumbering,
    SpanStage,
    restore_spans,
)
from fmsdata.statecheck import need_count, need_keys, within

__all__ = ["ShuffleBuffer", "PUSH", "BUFFER_KEY", "pack_lines", "unpack_lines", "apply_journal"]

BUFFER_KEY = "buffer"  # where a shuffle buffer's own state keeps its lines

PUSH = -1
_HASH_BLOCK = 256  # shuffle hashes are computed this many emissions at a time


class ShuffleBuffer(SpanStage):
    """Hands out packed lines in a window-local random order.

    State keys: ``emitted`` (lines handed out), ``buffer`` (``{"spans", "offsets"}``, see
    ``pack_lines``) and ``source`` (packer state).

    Args:
        source: The lines to shuffle (a span stage).
        window: Lines held at most; 0 or 1 passes lines through in order.
        key: Shuffle key (derived from seed and logical shard).
    """

    role = "shuffle"

    def __init__(self, source: SpanStage, window: int, key: int):
        super().__init__(source)
        self.window = window
        # Set by the shard pipeline on the one buffer whose changes travel as a journal;
        # ``light`` leaves the buffer out of the state while the pipeline takes a light one.
        self.journaled = False
        self.light = False
        self.key = key
        self.emitted = 0
        self.buffer: list[np.ndarray] = []
        self._ops: list[int] = []
        self._pushed: list[np.ndarray] = []
        self._hashes: list[int] = []  # hash values for emissions _hash_start, ...
        self._hash_start = 0

    def __next__(self) -> np.ndarray:
        return self.take(1)[0]

    def take(self, n: int) -> list[np.ndarray]:
        if self.window <= 1:
            self.emitted += n
            return self.source.take(n)
        # How many lines the n steps push (up to two per step while below the window): the
        # source's lines do not depend on the slots taken, so they are pulled in one call.
        size, pushes, window = len(self.buffer), [], self.window
        for _ in range(n):
            push = min(2, max(window - size, 0))
            pushes.append(push)
            size += push - 1
        incoming = iter(self.source.take(sum(pushes)))
        buffer, out = self.buffer, []
        ops, pushed = (self._ops, self._pushed) if self.journaled else (None, None)
        for push in pushes:
            for _ in range(push):
                line = next(incoming)
                buffer.append(line)
                if ops is not None:
                    ops.append(PUSH)
                    pushed.append(line)
            at = self.emitted - self._hash_start
            if not 0 <= at < len(self._hashes):
                self._hash_start, at = self.emitted, 0
                self._hashes = hash_values(self.key, self.emitted, _HASH_BLOCK)
            slot = self._hashes[at] % len(buffer)
            if ops is not None:
                ops.append(slot)
            self.emitted += 1
            out.append(_take(buffer, slot))
        return out

    def drain_journal(self) -> tuple[list[int], list[np.ndarray]]:
        """Buffer changes since the last call: ``(ops, pushed lines)``."""
        journal = (self._ops, self._pushed)
        self._ops, self._pushed = [], []
        return journal

    def own_state(self) -> dict[str, Any]:
        if self.light:
            return {"emitted": self.emitted}
        return {"emitted": self.emitted, BUFFER_KEY: pack_lines(self.buffer)}

    def load_own_state(self, state: dict[str, Any]) -> None:
        self.emitted = need_count(state["emitted"], "emitted")
        with within(BUFFER_KEY):
            self.buffer = unpack_lines(state[BUFFER_KEY])
        if len(self.buffer) > max(self.window, 0):
            raise StateMismatchError(
                f"shuffle buffer state holds {len(self.buffer)} lines, more than "
                f"shuffle_window={self.window}"
            )
        self._ops, self._pushed = [], []

    def settings(self) -> dict[str, Any]:
        return {"window": self.window}

    def renumber(self, own: dict[str, Any], change: DatasetRenumbering) -> dict[str, Any]:
        buffer = dict(own[BUFFER_KEY])
        buffer["spans"] = change.spans(buffer["spans"], "shuffle buffer")
        return {**own, BUFFER_KEY: buffer}

    def held_spans(self, own: dict[str, Any]) -> np.ndarray:
        return np.asarray(own[BUFFER_KEY]["spans"], dtype=np.int64)


def _int_array(value: Any, path: str) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        if array.size == 0 and array.dtype.kind == "f":  # an empty list read back from JSON
            return array.astype(np.int64)
        raise StateMismatchError(f"{path}: expected integers, got {array.dtype} {value!r:.80}")
    return array.astype(np.int64)


def _take(buffer: list[np.ndarray], slot: int) -> np.ndarray:
    line = buffer[slot]
    last = buffer.pop()
    if slot < len(buffer):
        buffer[slot] = last
    return line


def apply_journal(
    buffer: list[np.ndarray], ops: Iterable[int], pushed: Iterator[np.ndarray]
) -> None:
    """Replay buffer changes recorded by ``ShuffleBuffer`` onto a copy of its buffer."""
    append, pop = buffer.append, buffer.pop
    for op in ops:
        if op == PUSH:
            append(next(pushed))
        else:  # _take, inlined: this runs in the main process for every line
            last = pop()
            if op < len(buffer):
                buffer[op] = last


def pack_lines(lines: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Lines of spans as two flat arrays: ``spans`` [n, 5] and ``offsets`` [lines + 1]."""
    lengths = np.fromiter((len(line) for line in lines), dtype=np.int64, count=len(lines))
    offsets = np.zeros(len(lines) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not lines:
        return {"spans": np.zeros((0, SAVED_SPAN_WIDTH), dtype=np.int64), "offsets": offsets}
    return {"spans": np.concatenate(lines)[:, :SAVED_SPAN_WIDTH].copy(), "offsets": offsets}


def unpack_lines(packed: dict[str, Any]) -> list[np.ndarray]:
    """Inverse of ``pack_lines``, validating shapes and values (paths relative to the
    buffer: ``spans[4][1]``, ``offsets``)."""
    need_keys(packed, "", ("spans", "offsets"))
    spans, offsets = (_int_array(packed[key], key) for key in ("spans", "offsets"))
    if spans.ndim != 2 or spans.shape[1] != SAVED_SPAN_WIDTH:
        raise StateMismatchError(
            f"spans: must have shape [n, {SAVED_SPAN_WIDTH}], got {spans.shape}"
        )
    if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != len(spans):
        raise StateMismatchError(
            f"offsets: do not match the {len(spans)} spans they index: {offsets.tolist()[:20]}"
        )
    if np.any(np.diff(offsets) <= 0):
        raise StateMismatchError(
            f"offsets: must be strictly increasing (no empty line), got {offsets.tolist()[:20]}"
        )
    low = np.zeros(SAVED_SPAN_WIDTH, dtype=np.int64)
    low[LENGTH] = 1  # a piece holds at least one token
    bad = np.argwhere(spans < low)
    if len(bad):
        row, col = (int(v) for v in bad[0])
        raise StateMismatchError(
            f"spans[{row}][{col}]: must be at least {int(low[col])}, got {int(spans[row, col])} "
            f"(span {spans[row].tolist()})"
        )
    spans = restore_spans(spans)
    return [spans[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
