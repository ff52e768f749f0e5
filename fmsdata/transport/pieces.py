"""The dataset of every input token of a batch, from its workers' items.

With a mix that follows the loss (``mix_policy``) each item carries its rows' input
pieces and their datasets (``WorkerItem.mix_pieces``); a batch's are gathered here in
canonical row order, without a loop over rows, for ``record_loss`` to attribute a loss by.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fmsdata.transport.items import WorkerItem

__all__ = ["token_datasets"]


def token_datasets(
    items: Sequence[WorkerItem], k: int, batch_size: int, seq_length: int
) -> np.ndarray | None:
    """``[batch_size, seq_length]`` int64: the dataset index
    of each input token of batch ``k`` of ``items``, -1 on padding; None when the items
    carry no pieces (no feedback mix, or a custom preprocess)."""
    rows, lengths, datasets = [], [], []
    for item in items:
        pieces = item.mix_pieces
        if pieces is None:
            return None
        flat, counts, ds = pieces
        a, b = int(item.offsets[k]), int(item.offsets[k + 1])
        if b == a:
            continue
        first = int(counts[:a].sum())
        last = first + int(counts[a:b].sum())
        rows.append(np.repeat(item.rows[a:b], counts[a:b]))
        lengths.append(flat[first:last])
        datasets.append(ds[first:last])
    if not rows:
        return None
    row = np.concatenate(rows)
    order = np.argsort(row, kind="stable")  # canonical row order, pieces in line order
    out = np.repeat(np.concatenate(datasets)[order], np.concatenate(lengths)[order])
    if out.size != batch_size * seq_length:
        raise AssertionError(
            f"pieces cover {out.size} input tokens, the batch has {batch_size * seq_length}"
        )
    return out.reshape(batch_size, seq_length)
