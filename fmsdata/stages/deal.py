"""How a dataset's documents are dealt to the logical shards: index arithmetic on counts.

**The file deal** (fms-fsdp's layout, the one every dataset of real files without odd
files gets): each file is cut into ``L`` fragments, the ``F * L`` fragments are laid end
to end (file by file) and dealt to the ``L`` logical shards in contiguous runs of ``F``.
A shard reads a few neighbouring files and needs the document counts of those only. Each
file counts as one unit whatever it holds, so a file that gives nothing (no document, or
none that passes ``min_length``) leaves the shards whose run falls on it with nothing.

**The document deal** (any dataset holding such a file, or whose file deal leaves a shard
without documents, e.g. a few one-document files and more shards): the documents of the
*live* files (those holding a document that passes) laid end to end in file order, cut
into ``L`` contiguous runs of equal count. Shares are then computed over the documents
that exist, however they fall into files; a shard gets none only when the live files hold
fewer than ``L`` documents, and such a dataset rotates (``fmsdata.stages.documents``).

Both deals are pure functions of the per-file counts (and liveness), so every rank, worker
and resume computes the same shares; rows are ``(file, first_doc, end_doc)``, non-empty,
in file order.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "all_fragments",
    "document_deal",
    "file_deal_fits",
    "shard_files",
    "shard_fragments",
]


def shard_fragments(counts: np.ndarray, n_shards: int, shard: int) -> np.ndarray:
    """The file deal's document ranges of one logical shard: rows ``(file, first_doc,
    end_doc)``, non-empty.

    ``counts`` needs to be correct only for the files the shard touches (the others may
    be -1); use ``shard_files`` to find which those are.
    """
    n_files = len(counts)
    rows = []
    for f in shard_files(n_files, n_shards, shard):
        lo_part = max(shard * n_files, f * n_shards) - f * n_shards
        hi_part = min((shard + 1) * n_files, (f + 1) * n_shards) - f * n_shards
        n = int(counts[f])
        lo, hi = n * lo_part // n_shards, n * hi_part // n_shards
        if hi > lo:
            rows.append((f, lo, hi))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def shard_files(n_files: int, n_shards: int, shard: int) -> range:
    """Indices of the files whose fragments fall to ``shard`` in the file deal."""
    first = shard * n_files // n_shards
    last = ((shard + 1) * n_files - 1) // n_shards
    return range(first, last + 1)


def all_fragments(counts: np.ndarray, n_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """Every logical shard's document ranges of the file deal at once: rows ``(file,
    first_doc, end_doc)`` (non-empty, in file order) and the shard of each row; the rows of
    shard ``q`` are ``shard_fragments(counts, n_shards, q)``. ``counts`` must be known for
    every file."""
    n_files = len(counts)
    grid = np.union1d(
        np.arange(0, n_files * n_shards + 1, n_shards),
        np.arange(0, n_files * n_shards + 1, n_files),
    )
    lo_g, hi_g = grid[:-1], grid[1:]
    files = lo_g // n_shards
    n = np.asarray(counts, dtype=np.int64)[files]
    lo = n * (lo_g - files * n_shards) // n_shards
    hi = n * (hi_g - files * n_shards) // n_shards
    keep = hi > lo
    rows = np.stack([files, lo, hi], axis=1)[keep].astype(np.int64).reshape(-1, 3)
    return rows, (lo_g // n_files)[keep].astype(np.int64)


def file_deal_fits(counts: np.ndarray, n_shards: int) -> bool:
    """Whether the file deal gives every logical shard at least one document."""
    _, owner = all_fragments(counts, n_shards)
    return len(np.unique(owner)) == n_shards


def document_deal(
    counts: np.ndarray, live: np.ndarray, n_shards: int
) -> tuple[np.ndarray, np.ndarray]:
    """The document deal (module docstring): rows ``(file, first_doc, end_doc)`` over the
    live files (non-empty, in file order) and the shard of each row. Shard ``q`` holds
    documents ``[N * q // L, N * (q + 1) // L)`` of the ``N`` documents of the live files
    laid end to end; the files that are not live hold none."""
    n = np.where(np.asarray(live, dtype=bool), np.asarray(counts, dtype=np.int64), 0)
    ends = np.cumsum(n)
    starts = ends - n
    total = int(ends[-1]) if len(ends) else 0
    cuts = total * np.arange(n_shards + 1, dtype=np.int64) // n_shards
    grid = np.union1d(np.concatenate([starts, ends]), cuts)
    lo_g, hi_g = grid[:-1], grid[1:]
    keep = hi_g > lo_g
    lo_g, hi_g = lo_g[keep], hi_g[keep]
    # Each grid cell lies inside one file (file ends are grid points) and one shard's run
    # (cuts are too); the first file ending past the cell's start holds it (empty files
    # end where they start, so they are passed over).
    files = np.searchsorted(ends, lo_g, side="right")
    owner = np.searchsorted(cuts, lo_g, side="right") - 1
    rows = np.stack([files, lo_g - starts[files], hi_g - starts[files]], axis=1)
    return rows.astype(np.int64).reshape(-1, 3), owner.astype(np.int64)
