"""Count the documents (and tokens) of remote shard files from their metadata alone.

A root without ``meta/counts.csv`` used to be counted by downloading every file. The
formats carry their counts in small parts of the file, fetched here with range requests
(through the root's fsspec filesystem, retried), many files at a time:

- Arrow, one record batch per document: the footer lists the batches (documents); each
  batch's message header holds its row count (tokens), read only when tokens are asked
  for, in ranges merged where bodies are small;
- Megatron: the ``.idx`` file (sizes and document index; the ``.bin`` is never read);
- Modalities ``.pbin``: the 12-byte header, then the index after the data section;
- MDS: the folder's ``index.json`` (``samples`` per shard; tokens need the shards);
- Parquet with a token list column: the footer's row count (documents).

A format (or file) not handled here is counted where a shard opens it, which for a
remote root downloads it: ``count_catalog`` says so once, with the ``fmsdata index``
command that writes the counts file instead. A handler of the user's may define
``count_metadata(read, path, size, tokens) -> (documents, tokens) | None`` to join in
(``read(path, start, end) -> bytes``; tokens -1 where unknown).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import posixpath
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fmsdata.data import filecounts
from fmsdata.handlers.arrow_index import batch_rows, footer_blocks, footer_length

__all__ = [
    "count_catalog",
    "count_files",
    "first_lengths",
    "logged_progress",
    "metadata_counter",
    "THREADS",
]

logger = logging.getLogger(__name__)

THREADS = 16  # range requests in flight (object stores answer many at once)
_TAIL = 64 << 10  # first guess of an Arrow footer's size
_MERGE_GAP = 64 << 10  # header ranges closer than this are read as one
_FIRST_DOCS = 16  # documents whose lengths ``first_lengths`` reads at most
_FIRST_SPAN = 256 << 10  # ... when their headers lie within this many bytes (else the first)
Read = Callable[[str, int, int], bytes]
Counter = Callable[[Read, str, int, bool], "tuple[int, int] | None"]


def _arrow(read: Read, path: str, size: int, tokens: bool) -> tuple[int, int] | None:
    tail = read(path, max(0, size - _TAIL), size)
    need = footer_length(tail)
    if need is None:
        return None
    if need > len(tail):
        tail = read(path, max(0, size - need), size)
    blocks = footer_blocks(np.frombuffer(tail, dtype=np.uint8))
    if blocks is None:
        return None
    offsets, meta_lengths = blocks
    if not tokens or not len(offsets):
        return len(offsets), (0 if not len(offsets) else filecounts.UNKNOWN)
    # Only the message headers: consecutive ones closer than _MERGE_GAP are one request.
    starts, ends = offsets, offsets + meta_lengths
    cuts = np.flatnonzero(starts[1:] - ends[:-1] > _MERGE_GAP) + 1
    first = np.concatenate([[0], cuts])
    last = np.concatenate([cuts, [len(starts)]]) - 1
    total = 0
    for a, b in zip(first.tolist(), last.tolist()):
        data = np.frombuffer(read(path, int(starts[a]), int(ends[b])), dtype=np.uint8)
        rows = batch_rows(data, starts[a : b + 1] - starts[a])
        if rows is None:
            return None
        total += int(rows.sum())
    return len(offsets), total


def _megatron(read: Read, path: str, size: int, tokens: bool) -> tuple[int, int] | None:
    data = read(path, 0, size)  # the .idx: sizes and document index only
    if len(data) < 34 or data[:9] != b"MMIDIDX\x00\x00":
        return None
    sequences = int(np.frombuffer(data, np.uint64, 1, 18)[0])
    entries = int(np.frombuffer(data, np.uint64, 1, 26)[0])
    if len(data) < 34 + 12 * sequences + 8 * entries or entries < 1:
        return None
    lengths = np.frombuffer(data, np.int32, sequences, 34)
    return entries - 1, int(lengths.astype(np.int64).sum())


def _pbin(read: Read, path: str, size: int, tokens: bool) -> tuple[int, int] | None:
    from fmsdata.handlers.safe_pickle import read_int_pairs

    head = read(path, 0, 12)
    if len(head) < 12:
        return None
    data_len = int(np.frombuffer(head, np.uint64, 1, 0)[0])
    token_size = int(np.frombuffer(head, np.uint32, 1, 8)[0])
    if token_size not in (1, 2, 4) or 12 + data_len > size:
        return None
    pairs = read_int_pairs(read(path, 12 + data_len, size), f"{path} (index)")
    return len(pairs), int(pairs[:, 1].sum()) // token_size if len(pairs) else 0


def _mds(read: Read, path: str, size: int, tokens: bool) -> tuple[int, int] | None:
    if tokens:
        return None
    index = posixpath.join(posixpath.dirname(path), "index.json")
    try:
        shards = json.loads(read(index, 0, -1))["shards"]
    except (KeyError, ValueError, TypeError):
        return None
    name = posixpath.basename(path)
    for shard in shards:
        names = {(shard.get(k) or {}).get("basename") for k in ("raw_data", "zip_data")}
        if name in names:
            return int(shard["samples"]), filecounts.UNKNOWN
    return None


def _parquet(handler: Any) -> Counter:
    from fmsdata.handlers.base import column_candidates

    def count(read: Read, path: str, size: int, tokens: bool) -> tuple[int, int] | None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if tokens:
            return None
        tail = read(path, max(0, size - _TAIL), size)
        if len(tail) < 8 or tail[-4:] != b"PAR1":
            return None
        need = int(np.frombuffer(tail[-8:-4], "<u4")[0]) + 8
        if need > len(tail):
            tail = read(path, max(0, size - need), size)
        try:
            meta = pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-need:]))
        except (pa.ArrowException, OSError):
            return None
        schema = meta.schema.to_arrow_schema()
        for name in column_candidates(handler.col_name):
            if name in schema.names:
                kind = schema.field(name).type
                if pa.types.is_list(kind) or pa.types.is_large_list(kind):
                    return int(meta.num_rows), filecounts.UNKNOWN
                return None  # text: rows without text may be skipped, tokens need the text
        return None

    return count


def metadata_counter(handler: Any, path: str) -> Counter | None:
    """How to count ``path`` from its metadata with ``handler``, or None (whole file)."""
    own = getattr(handler, "count_metadata", None)
    if callable(own):
        return own  # type: ignore[no-any-return]
    from fmsdata.handlers import AutoHandler, MdsHandler, MegatronHandler, PbinHandler
    from fmsdata.handlers.arrow import ArrowDocHandler
    from fmsdata.handlers.parquet import ParquetHandler

    if isinstance(handler, AutoHandler):
        if path.endswith(".idx"):
            return _megatron
        if path.endswith(".pbin"):
            return _pbin
        if path.endswith((".mds", ".mds.zstd")):
            return _mds
        return None  # .arrow may be either Arrow layout: only its reader tells
    for kind, counter in (
        (ArrowDocHandler, _arrow),
        (MegatronHandler, _megatron),
        (PbinHandler, _pbin),
        (MdsHandler, _mds),
    ):
        if isinstance(handler, kind):
            return counter
    if isinstance(handler, ParquetHandler):
        return _parquet(handler)
    return None


def count_files(
    base: str,
    relatives: Sequence[str],
    sizes: Sequence[int],
    handler: Any,
    read: Read,
    tokens: bool,
    progress: Callable[[int, int], None] | None = None,
    threads: int = THREADS,
) -> list[tuple[int, int] | None]:
    """Counts of files under ``base`` from their metadata, ``THREADS`` files at a time;
    None for a file its format cannot count that way."""

    def one(job: tuple[str, int]) -> tuple[int, int] | None:
        relative, size = job
        path = f"{base}/{relative}"
        counter = metadata_counter(handler, path)
        return None if counter is None else counter(read, path, int(size), tokens)

    jobs = list(zip(relatives, sizes))
    out: list[tuple[int, int] | None] = []
    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        for result in pool.map(one, jobs):
            out.append(result)
            if progress is not None:
                progress(len(out), len(jobs))
    return out


def logged_progress(
    progress: Callable[[int, int], None] | None, what: str, every: float = 10.0
) -> Callable[[int, int], None]:
    """``progress`` (the CLI's bar, if any), and a log line every ``every`` seconds of a
    long listing: a loader that must count thousands of files says how far it is."""
    last = [time.monotonic()]

    def report(done: int, total: int) -> None:
        if progress is not None:
            progress(done, total)
        now = time.monotonic()
        if now - last[0] >= every and done < total:
            last[0] = now
            logger.info("%s: %d of %d file(s)", what, done, total)

    return report


def count_catalog(
    root: str,
    datasets: Sequence[Any],
    handler: Any,
    listing: Any,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Fill in, in place, the unknown document counts of a remote root's ``DatasetFiles``
    from the files' metadata (remembered for the process: ``filecounts``); warn once,
    with the command that avoids it, when files are left to be downloaded to be counted."""
    fs = listing.fs

    def read(path: str, start: int, end: int) -> bytes:
        if end < 0:
            return listing.call("read", fs.cat_file, path)  # type: ignore[no-any-return]
        return listing.call("read", fs.cat_file, path, start=start, end=end)  # type: ignore[no-any-return]

    jobs = [(ds, i) for ds in datasets for i in np.flatnonzero(ds.docs < 0).tolist()]
    if not jobs:
        return
    logger.info("counting the documents of %d file(s) of %s from their metadata", len(jobs), root)
    started = time.monotonic()
    results = count_files(
        listing.base,
        [ds.paths[i] for ds, i in jobs],
        [int(ds.sizes[i]) for ds, i in jobs],
        handler,
        read,
        tokens=False,
        progress=logged_progress(progress, f"counting {root}"),
    )
    logger.info("counted %d file(s) of %s in %.1f s", len(jobs), root, time.monotonic() - started)
    left = 0
    for (ds, i), result in zip(jobs, results):
        if result is None:
            left += 1
            continue
        ds.docs[i], ds.tokens[i] = result
        filecounts.remember(root, ds.paths[i], int(ds.sizes[i]), *result)
    if left:
        logger.warning(
            "%d file(s) under %s are counted by downloading them (their format keeps no "
            "document count in its metadata); run `fmsdata index %s` once to write "
            "meta/counts.csv and start without it",
            left,
            root,
            root,
        )


def _arrow_first(read: Read, path: str, size: int) -> np.ndarray | None:
    """Token counts of the first documents of a one-batch-per-document Arrow file: the
    footer, then the first batch headers (one range; only the first when they are far
    apart)."""
    tail = read(path, max(0, size - _TAIL), size)
    need = footer_length(tail)
    if need is None:
        return None
    if need > len(tail):
        tail = read(path, max(0, size - need), size)
    blocks = footer_blocks(np.frombuffer(tail, dtype=np.uint8))
    if blocks is None:
        return None
    offsets, meta_lengths = blocks
    k = min(len(offsets), _FIRST_DOCS)
    if not k:
        return np.zeros(0, dtype=np.int64)
    ends = offsets[:k] + meta_lengths[:k]
    k = max(1, int(np.searchsorted(ends - offsets[0], _FIRST_SPAN, side="right")))
    data = np.frombuffer(read(path, int(offsets[0]), int(ends[k - 1])), dtype=np.uint8)
    return batch_rows(data, offsets[:k] - offsets[0])


def first_lengths(
    root: str, storage: Any, relatives: Sequence[str], sizes: Sequence[int], handler: Any
) -> list[np.ndarray | None]:
    """The token counts of the first documents of remote files, from their metadata alone
    (range requests, ``THREADS`` files at a time): what settles, without downloading it,
    that a file holds a document long enough to be kept. None for a file whose format
    keeps no such metadata (Arrow, one record batch per document, does)."""
    from fmsdata.handlers.arrow import ArrowDocHandler
    from fmsdata.remote.retry import retrying

    if not isinstance(handler, ArrowDocHandler) or not relatives:
        return [None] * len(relatives)
    fs, base = storage.filesystem(root)

    def read(path: str, start: int, end: int) -> bytes:
        url = root.rstrip("/") + path[len(base) :]
        return retrying(  # type: ignore[no-any-return]
            storage.retry, url, fs.cat_file, path, what="read", start=start, end=end
        )

    def one(job: tuple[str, int]) -> np.ndarray | None:
        relative, size = job
        return _arrow_first(read, f"{base}/{relative}", int(size))

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(one, zip(relatives, sizes)))
