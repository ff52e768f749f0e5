"""A batch put back together from the workers' items, in canonical row order.

The main process hands the ring's slots out as they are (views, no token read or copied)
and computes only what is per piece (``cu_seqlens``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fmsdata.transport.batchring import BatchRing
from fmsdata.transport.items import WorkerItem

__all__ = ["assemble_batch"]


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
