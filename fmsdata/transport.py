"""What a DataLoader worker sends to the main process, and how batches come out of it.

Passing tensors between processes has a high fixed cost per item, so a worker sends
several consecutive batches at once (its rows of each). The tokens go into a ring of
shared-memory slots the main process allocated before starting the workers (no new
shared memory per item); the item itself is small metadata: where each row goes and
which shard made it, and, for the end of the item, the state of each shard it advanced
and the shuffle-buffer journal.
The main process cuts batches out in order and applies the causal-LM shift while widening
to int64. Its replica of the consumed state moves to a shard's item-end state once the
whole item is consumed; in between it counts the lines consumed past the last state (a
resume fast-forwards them, see ``fmsdata.replica``).
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn

import numpy as np
import torch

from fmsdata.errors import FmsDataError
from fmsdata.stages.outputs import IGNORE_INDEX

__all__ = [
    "WorkerItem",
    "WorkerError",
    "carry_errors",
    "item_batch_counts",
    "ring_shape",
    "assemble_batch",
]

# Tokens per item to aim for (the fixed cost of an item is then small beside its bytes),
# and the most batches one item may carry.
_ITEM_TOKENS = 1 << 21
_MAX_BATCHES_PER_ITEM = 64


@dataclasses.dataclass
class WorkerItem:
    """Rows of ``len(lights)`` consecutive batches produced by one worker.

    Attributes:
        offsets: [K + 1] start of each batch's rows in ``rows``/``tokens``.
        rows: [R] row index of each produced line inside its batch.
        tokens: [R, line_length] int32 tokens, or None when they are in a ring slot or a
            custom preprocess ran.
        slot: Ring slot holding the tokens (first R rows), or None.
        content: [R] non-pad tokens per line.
        segments: Flat document-piece lengths of every row (None unless requested).
        segment_counts: [R] pieces per row.
        segment_ids: Document id of each piece in ``segments`` (None unless requested).
        samples: Custom preprocess outputs, each [R, ...] (None on the built-in path).
        row_shards: [R] logical shard of each row.
        lights: ``{shard id: light state}`` at the end of the item, for the shards advanced.
        ops: [n, 2] shuffle journal ``(shard id, op)`` of the whole item.
        pushed: [P, span width] spans of the lines pushed, in op order.
        pushed_offsets: [pushes + 1] line boundaries in ``pushed``.
    """

    offsets: np.ndarray
    rows: np.ndarray
    row_shards: np.ndarray
    tokens: torch.Tensor | None
    slot: int | None
    content: np.ndarray
    segments: np.ndarray | None
    segment_counts: np.ndarray | None
    segment_ids: np.ndarray | None
    samples: dict[str, torch.Tensor] | None
    lights: dict[int, dict[str, Any]]
    ops: np.ndarray
    pushed: np.ndarray
    pushed_offsets: np.ndarray


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


def ring_shape(
    batch_size: int,
    line_length: int,
    prefetch_factor: int,
    num_workers: int = 1,
    n_local: int | None = None,
) -> tuple[int, int, int]:
    """(slots, rows, line_length) of one worker's token ring.

    A worker can be at most ``prefetch_factor`` items ahead of the item the main process is
    reading, so that many slots plus one are never overwritten while still in use. A slot
    holds the rows a worker makes of one item at full size: its share of the rank's
    ``n_local`` shards (the larger share where they do not divide evenly) of every row,
    plus a batch. An item past that (the deal levelling shards after a rescale) sends its
    tokens inside the item instead.
    """
    total = max(item_batch_counts(batch_size, line_length, num_workers)) * batch_size
    if num_workers > 1 and n_local:
        share = -(-n_local // num_workers)
        rows = min(total, -(-total * share // n_local) + batch_size)
    else:
        rows = total
    return prefetch_factor + 2, rows, line_length


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


def assemble_batch(
    items: list[WorkerItem],
    tokens_of: list[torch.Tensor | None],
    k: int,
    batch_size: int,
    want_position_ids: bool,
    want_cu_seqlens: bool,
    pin_memory: bool,
    want_document_ids: bool = False,
) -> dict[str, torch.Tensor]:
    """Batch ``k`` of the given items (one per worker) in canonical row order.

    ``tokens_of[w]`` holds item ``w``'s token rows (from its ring slot or the item).
    """
    spans = [(item, int(item.offsets[k]), int(item.offsets[k + 1])) for item in items]
    single = len(items) == 1
    pinned = pin_memory and torch.cuda.is_available()
    if items[0].samples is not None:
        batch = {}
        for key in sorted({key for item in items for key in (item.samples or {})}):
            parts = [
                (samples[key], i.rows, a, b)
                for (i, a, b), samples in ((span, span[0].samples or {}) for span in spans)
                if key in samples
            ]
            batch[key] = _gather(parts, batch_size, single)
        return _pin(batch) if pinned else batch

    seq = (tokens_of[0].shape[1] if tokens_of[0] is not None else 1) - 1
    # Pinned outputs are written in place: pinning costs no copy of its own.
    input_ids = torch.empty((batch_size, seq), dtype=torch.int64, pin_memory=pinned)
    labels = torch.empty((batch_size, seq), dtype=torch.int64, pin_memory=pinned)
    inputs_np, labels_np = input_ids.numpy(), labels.numpy()
    content = np.empty(batch_size, dtype=np.int64)
    # One pass per output straight out of the (shared, soon reused) int32 rows: the shift,
    # the widening to int64 and, with several workers, the gather into row order at once.
    for values, (item, a, b) in zip(tokens_of, spans):
        if b == a:
            continue
        rows = values[a:b].numpy() if isinstance(values, torch.Tensor) else values[a:b]
        # A worker's rows come in row order: all of a batch's rows are a plain slice copy.
        where = slice(None) if single or b - a == batch_size else item.rows[a:b]
        inputs_np[where] = rows[:, :-1]
        labels_np[where] = rows[:, 1:]
        content[where] = item.content[a:b]
    if (content <= seq).any():  # padded rows: no loss from the last content token on
        labels_np[np.arange(seq)[None, :] >= np.maximum(content - 1, 0)[:, None]] = IGNORE_INDEX
    batch = {"input_ids": input_ids, "labels": labels}
    if want_position_ids or want_cu_seqlens or want_document_ids:
        segments = _row_segments(spans, batch_size)
        lengths = np.concatenate(segments)
        if want_position_ids:
            starts = np.cumsum(lengths) - lengths
            flat = np.arange(batch_size * seq, dtype=np.int64) - np.repeat(starts, lengths)
            batch["position_ids"] = torch.from_numpy(flat.reshape(batch_size, seq))
        if want_cu_seqlens:
            cu = np.zeros(len(lengths) + 1, dtype=np.int32)
            np.cumsum(lengths, out=cu[1:])
            batch["cu_seqlens"] = torch.from_numpy(cu)
            batch["max_seqlen"] = torch.tensor(int(lengths.max()))
        if want_document_ids:
            ids = np.concatenate(_row_segments(spans, batch_size, "segment_ids"))
            flat_ids = np.repeat(ids, lengths)
            batch["document_ids"] = torch.from_numpy(flat_ids.reshape(batch_size, seq))
        if pinned:
            batch.update(_pin({k: v for k, v in batch.items() if k not in ("input_ids", "labels")}))
    return batch


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


def _pin(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.pin_memory() for k, v in batch.items()}
