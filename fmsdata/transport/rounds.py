"""How many batches a worker's items hold, how items group into rounds, and how many
batches the final-batch ring holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

__all__ = ["item_batch_counts", "item_rounds", "items_per_round", "ring_slots"]

# Tokens per item to aim for (the fixed cost of an item is then small beside its bytes),
# and the most batches one item may carry.
_ITEM_TOKENS = 1 << 21


_MAX_BATCHES_PER_ITEM = 64


# Items a worker makes from one visit of each logical shard (``item_rounds``): as many as
# keep a round's lines within _ROUND_SPANS spans, from _MIN_ITEMS_PER_ROUND to
# _ITEMS_PER_ROUND. A round ends with the state of every shard it visited, and a shuffle
# buffer's state is its whole window: on 60-token documents (about 68 spans a line, a
# window of 156 lines) a round of 4 items packed five times the spans it moved, 14 % of a
# worker's time (one worker, 2-core box); at 16 items it packs about as many as it moves.
_ITEMS_PER_ROUND = 16


_MIN_ITEMS_PER_ROUND = 1


_ROUND_SPANS = 5 << 17  # 655,360 spans: at most about 37 MB of a round's lines


# Batches the caller may keep, without workers, before batches go to fresh memory.
_KEPT_BATCHES = 8


def ring_slots(batch_size: int, line_length: int, prefetch_factor: int, num_workers: int) -> int:
    """Batches the final-batch ring holds (``fmsdata.transport.batchring``).

    A worker can be at most ``prefetch_factor`` items ahead of the item the main process
    is reading, so that many items plus two never reach a slot the main process or the
    training loop (keeping the batch it works on and a few before) still uses; without
    workers, items are made one at a time, and a few batches more leave room for the
    caller's. Batches kept longer go to fresh memory (``fmsdata.transport.batchwrite``).
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
    (16 on documents of 60 tokens or more, 4 on 15-token ones, one item on documents of
    a few tokens, whose lines hold thousands of spans: a round's spans stay within tens
    of megabytes)."""
    fit = _ROUND_SPANS // spans_per_item if spans_per_item > 0 else _ITEMS_PER_ROUND
    return int(min(_ITEMS_PER_ROUND, max(_MIN_ITEMS_PER_ROUND, fit)))
