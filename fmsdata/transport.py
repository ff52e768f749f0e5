"""What a DataLoader worker sends to the main process, and how batches come out of it.

Passing tensors between processes has a high fixed cost per item, so a worker sends
several consecutive batches at once (its rows of each). The worker writes its rows as the
final batch tensors, each at its canonical row of its batch, into the batch's slot of a
ring in shared memory that the main process allocated before starting the workers
(``fmsdata.batchring``, ``fmsdata.batchwrite``); the item itself is small metadata: which
batches went to their slots, where each row goes and which shard made it. A worker visits
its shards once for several items (a round, ``item_rounds``): the round's last item also
carries the whole state of each shard the round advanced, at its end, as one opaque blob
(``ShardStates``). The main process hands the slots out as they are (views, no token read
or copied) and computes only what is per piece (``cu_seqlens``). What it consumed moves to
a shard's round-end state once the round's last item is consumed; in between it counts
the lines consumed past the last state (a resume replays them at span level, see
``fmsdata.replica``).
"""

from __future__ import annotations

import dataclasses
import pickle
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import numpy as np
import torch

from fmsdata.batchring import BatchRing
from fmsdata.errors import FmsDataError

__all__ = [
    "WorkerItem",
    "WorkerError",
    "ShardStates",
    "carry_errors",
    "item_batch_counts",
    "item_rounds",
    "items_per_round",
    "ring_slots",
    "assemble_batch",
]

# Tokens per item to aim for (the fixed cost of an item is then small beside its bytes),
# and the most batches one item may carry.
_ITEM_TOKENS = 1 << 21
_MAX_BATCHES_PER_ITEM = 64
# Items a worker makes from one visit of each logical shard (``item_rounds``): as many as
# keep a round's lines within _ROUND_SPANS spans (four items of 60-token documents, about
# 68 spans a line, as every round held before rounds were sized), from
# _MIN_ITEMS_PER_ROUND to _ITEMS_PER_ROUND.
_ITEMS_PER_ROUND = 16
_MIN_ITEMS_PER_ROUND = 1
_ROUND_SPANS = 5 << 15
# Blobs of shard states at least this large travel in shared memory (``ShardStates``).
_SHARED_BLOB = 1 << 16
# Batches the caller may keep, without workers, before batches go to fresh memory.
_KEPT_BATCHES = 8


@dataclasses.dataclass
class WorkerItem:
    """Rows of ``len(offsets) - 1`` consecutive batches produced by one worker.

    Attributes:
        offsets: [K + 1] start of each batch's rows in ``rows``.
        rows: [R] row index of each produced line inside its batch.
        first: Number of the item's first batch (``fmsdata.batchring``).
        placed: [K] whether the worker's rows of each batch are in the batch's ring slot.
        overflow: [fields, R, seq] the rows of the batches not placed, in item order
            (None when every batch is placed, or a custom preprocess ran).
        segments: Flat document-piece lengths of every row (None unless requested).
        segment_counts: [R] pieces per row.
        segment_ids: Document id of each piece in ``segments`` (None unless requested).
        samples: Custom preprocess outputs, each [R, ...] (None on the built-in path).
        row_shards: [R] logical shard of each row.
        states: The state of each shard its round advanced, at the round's end (only a
            round's last item carries them: ``item_rounds``).
        state_lines: [len(states.shards)] lines each of those shards emitted in the round
            (what ``states`` are past the shard's previous state).
    """

    offsets: np.ndarray
    rows: np.ndarray
    row_shards: np.ndarray
    first: int
    placed: np.ndarray
    overflow: torch.Tensor | None
    segments: np.ndarray | None
    segment_counts: np.ndarray | None
    segment_ids: np.ndarray | None
    samples: dict[str, torch.Tensor] | None
    states: ShardStates
    state_lines: np.ndarray


class ShardStates:
    """``{shard id: shard state}`` of the shards a round advanced, pickled as one opaque
    blob to travel and unpickled only when a state is read (``get``): the main process
    holds the latest blob of each shard but reads it only to save a state or to start
    workers. Without workers nothing is pickled at all.

    A large blob travels in shared memory (a uint8 tensor: the main process maps it and
    reads none of it until a state is taken). Through the pipe its bytes would be copied
    into fresh heap pages of the main process with every round: on 60-token documents
    (1.3 MiB of buffered spans a rank, a round of 256 batches) that doubled the main
    process's CPU a batch with one worker on the 2-core box, 14 -> 27 us.

    Attributes:
        shards: The shard ids, in the order the states were given.
    """

    __slots__ = ("shards", "_blob", "_states")

    def __init__(self, states: dict[int, dict[str, Any]]):
        self.shards = tuple(states)
        self._states: dict[int, dict[str, Any]] | None = states
        self._blob: bytes | torch.Tensor | None = None

    def __getstate__(self) -> tuple[tuple[int, ...], bytes | torch.Tensor]:
        if self._blob is None:
            blob = pickle.dumps(self._states, protocol=pickle.HIGHEST_PROTOCOL)
            if len(blob) >= _SHARED_BLOB:
                shared = torch.empty(len(blob), dtype=torch.uint8).share_memory_()
                shared.numpy()[:] = np.frombuffer(blob, dtype=np.uint8)
                self._blob = shared
            else:
                self._blob = blob
        return self.shards, self._blob

    def __setstate__(self, state: tuple[tuple[int, ...], bytes | torch.Tensor]) -> None:
        self.shards, self._blob = state
        self._states = None

    def get(self, sid: int) -> dict[str, Any]:
        """Shard ``sid``'s state (shared: read it, do not change it)."""
        if self._states is None:
            blob = self._blob
            assert blob is not None
            self._states = pickle.loads(blob.numpy() if isinstance(blob, torch.Tensor) else blob)
            self._blob = None
        return self._states[sid]


@dataclasses.dataclass(frozen=True)
class WorkerError:
    """An ``FmsDataError`` a DataLoader worker raised, sent to the main process as an item.

    PyTorch re-raises a worker's exception in the main process as a new one of the same
    class whose message is ``Caught X in DataLoader worker process N.`` followed by the
    worker's whole traceback, the cause on its last line. Sent as an item instead, the
    error is raised in the main process as it was made: same class, same message (which
    names the file and what is wrong). The worker's traceback rides along as a note, shown
    only where a full traceback is printed.
    """

    error_type: type[FmsDataError]
    message: str
    worker: int
    traceback: str

    def reraise(self) -> NoReturn:
        error = self.error_type(self.message)
        error.add_note(f"Raised in DataLoader worker process {self.worker}:\n{self.traceback}")
        raise error


def carry_errors(items: Iterator[Any], worker: int) -> Iterator[Any]:
    """A worker's items, ending with a ``WorkerError`` in place of an ``FmsDataError`` that
    can be rebuilt from its message (every fmsdata error can; a user's subclass that takes
    other arguments is left to PyTorch's own wrapping)."""
    try:
        yield from items
    except FmsDataError as err:
        if not _rebuilds(err):
            raise
        yield WorkerError(type(err), str(err), worker, traceback.format_exc())


def _rebuilds(err: FmsDataError) -> bool:
    """Whether ``type(err)(message)`` makes the same error again."""
    try:
        return str(type(err)(str(err))) == str(err)
    except Exception:
        return False


def ring_slots(batch_size: int, line_length: int, prefetch_factor: int, num_workers: int) -> int:
    """Batches the final-batch ring holds (``fmsdata.batchring``).

    A worker can be at most ``prefetch_factor`` items ahead of the item the main process
    is reading, so that many items plus two never reach a slot the main process or the
    training loop (keeping the batch it works on and a few before) still uses; without
    workers, items are made one at a time, and a few batches more leave room for the
    caller's. Batches kept longer go to fresh memory (``fmsdata.batchwrite``).
    """
    per_item = item_batch_counts(batch_size, line_length, max(1, num_workers))[-1]
    if num_workers == 0:
        return per_item + _KEPT_BATCHES
    return (prefetch_factor + 2) * per_item


def item_batch_counts(batch_size: int, line_length: int, num_workers: int = 1) -> list[int]:
    """Batches per item for the first items; the last value repeats forever.

    Items start at one batch (a fast first batch) and double up to the size where the
    per-item cost stops mattering: about ``_ITEM_TOKENS`` tokens of each worker's own rows,
    so with ``num_workers`` workers an item spans that many times more batches (the main
    process pays a fixed cost per worker item).
    """
    per_batch = batch_size * line_length
    target = min(
        _MAX_BATCHES_PER_ITEM * num_workers, max(1, num_workers * _ITEM_TOKENS // per_batch)
    )
    counts = [1]
    while counts[-1] < target:
        counts.append(min(target, counts[-1] * 2))
    return counts


def item_rounds(
    counts: Sequence[int], spans_per_batch: Callable[[], float] = lambda: 0.0
) -> Iterator[list[int]]:
    """Items grouped into rounds (batches per item, as ``item_batch_counts`` gives them).

    A worker visits each logical shard once a round: one ``take`` of the shard's lines of
    every item of the round, and one state, taken at the round's end. The visit has a
    fixed cost (the chain's calls, its state; about 100 µs on short documents
    with 64 shards) that a round of many items pays once, without making items larger (the
    shared ring holds whole items). A round holds its lines' spans until its last item is
    made, so its size follows ``spans_per_batch()`` (the worker's spans per batch in the
    last round, 0 when not known): ``items_per_round``. The first items, while they grow,
    and the first of full size are a round each: the first batch waits for one item only.
    A state saved inside a round is the shards' state at the last round's end and the
    lines consumed since (replayed on resume). An error reading a shard's lines comes at
    the start of the round, before the batches of its earlier items.
    """
    for n in counts:
        yield [n]
    while True:
        yield [counts[-1]] * items_per_round(spans_per_batch() * counts[-1])


def items_per_round(spans_per_item: float) -> int:
    """Items of a round whose items hold ``spans_per_item`` spans each: as many as stay
    within ``_ROUND_SPANS`` spans, from ``_MIN_ITEMS_PER_ROUND`` to ``_ITEMS_PER_ROUND``
    (16 on documents of a few hundred tokens, 4 on 60-token ones, one item on documents of
    a few tokens, whose lines hold hundreds of spans: a round's spans stay a few
    megabytes)."""
    fit = _ROUND_SPANS // spans_per_item if spans_per_item > 0 else _ITEMS_PER_ROUND
    return int(min(_ITEMS_PER_ROUND, max(_MIN_ITEMS_PER_ROUND, fit)))


def assemble_batch(
    items: list[WorkerItem],
    ring: BatchRing | None,
    fields: tuple[str, ...],
    k: int,
    batch_size: int,
    want_cu_seqlens: bool,
    pin_memory: bool,
) -> dict[str, torch.Tensor]:
    """Batch ``k`` of the given items (one per worker) in canonical row order.

    The batch's per-token outputs are in its ring slot (handed out as views) or, where a
    worker found that slot still held, in the items' fresh memory: one worker's rows of
    it are a whole batch (views again); several workers' are copied together. Pinned, a
    batch in its slot is copied out into pinned memory, field by field (its slot free at
    once).
    """
    single = len(items) == 1
    pinned = pin_memory and torch.cuda.is_available()
    spans = None  # each item's rows of the batch, where the batch needs them
    if items[0].samples is not None:
        spans = _spans(items, k)
        batch = {}
        for key in sorted({key for item in items for key in (item.samples or {})}):
            parts = [
                (samples[key], i.rows, a, b)
                for (i, a, b), samples in ((span, span[0].samples or {}) for span in spans)
                if key in samples
            ]
            batch[key] = _gather(parts, batch_size, single)
        return _pin(batch) if pinned else batch

    number = items[0].first + k
    in_slot = ring is not None and all(item.placed[k] for item in items)
    pinned_fields: tuple[str, ...] = ()
    if in_slot and pinned:
        assert ring is not None
        tensors = ring.hand_out_pinned(number)
        pinned_fields = fields
    elif in_slot:
        assert ring is not None
        tensors = ring.hand_out(number)
    else:
        spans = _spans(items, k)
        tensors = _from_overflow(spans, ring, k, number, batch_size, single)
    batch = dict(zip(fields, tensors))
    if want_cu_seqlens:
        spans = spans or _spans(items, k)
        lengths = np.concatenate(_row_segments(spans, batch_size))
        cu = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu[1:])
        ids = batch.pop("document_ids", None)
        batch["cu_seqlens"] = torch.from_numpy(cu)
        batch["max_seqlen"] = torch.tensor(int(lengths.max()))
        if ids is not None:
            batch["document_ids"] = ids
    return _pin(batch, pinned_fields) if pinned else batch


def _spans(items: list[WorkerItem], k: int) -> list[tuple[WorkerItem, int, int]]:
    """Each item with the bounds of its rows of batch ``k``."""
    return [(item, int(item.offsets[k]), int(item.offsets[k + 1])) for item in items]


def _from_overflow(
    spans: list[tuple[WorkerItem, int, int]],
    ring: BatchRing | None,
    k: int,
    number: int,
    batch_size: int,
    single: bool,
) -> list[torch.Tensor]:
    """A batch some of whose rows are not in its ring slot: the one worker's fresh rows
    as they are, or every worker's part copied together into new memory."""
    item, a, b = spans[0]
    if single:
        assert item.overflow is not None, "the batch is in the item"
        parts = [item.overflow[f, a:b] for f in range(item.overflow.shape[0])]
    else:
        first = next(i for i, _, _ in spans if i.overflow is not None)
        assert first.overflow is not None
        fields, _, seq = first.overflow.shape
        out = np.empty((fields, batch_size, seq), dtype=first.overflow.numpy().dtype)
        slot = ring.claim(number) if ring is not None else None
        for item, a, b in spans:
            if b == a:
                continue
            rows = item.rows[a:b]
            if ring is not None and item.placed[k]:
                assert slot is not None, "a worker wrote the slot: it is free for this batch"
                out[:, rows] = slot[:, rows]
            else:
                assert item.overflow is not None, "the rows are in the item"
                out[:, rows] = item.overflow[:, a:b].numpy()
        parts = [torch.from_numpy(part) for part in out]
    if ring is not None:
        ring.pass_over(number)
    return parts


def _gather(
    parts: list[tuple[Any, np.ndarray, int, int]], batch_size: int, single: bool
) -> torch.Tensor:
    if single:
        values, _, a, b = parts[0]
        return values[a:b]
    first = parts[0][0]  # every part has the same trailing shape
    out = first.new_empty((batch_size, *first.shape[1:]))
    for values, rows, a, b in parts:
        if b > a:
            out[torch.from_numpy(rows[a:b])] = values[a:b]
    return out


def _row_segments(
    spans: list[tuple[WorkerItem, int, int]], batch_size: int, field: str = "segments"
) -> list[np.ndarray]:
    """Per row of the batch, its pieces' lengths (or, with ``field="segment_ids"``, ids)."""
    per_row: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * batch_size
    for item, a, b in spans:
        counts, segments = item.segment_counts, getattr(item, field)
        assert counts is not None and segments is not None, "segments requested"
        first = int(counts[:a].sum())
        bounds = np.cumsum(counts[a:b]) + first
        starts = bounds - counts[a:b]
        for row, s, e in zip(item.rows[a:b].tolist(), starts.tolist(), bounds.tolist()):
            per_row[row] = segments[s:e]
    return per_row


def _pin(batch: dict[str, torch.Tensor], pinned: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """``batch`` in pinned memory (the fields in ``pinned`` are there already)."""
    return {k: v if k in pinned else v.pin_memory() for k, v in batch.items()}
