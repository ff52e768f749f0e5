"""Count the documents (and tokens) of remote shard files from their metadata alone.

A root without ``meta/counts.csv`` used to be counted by downloading every file. Most
formats carry their counts in small parts of the file, which each handler reads itself
with range requests (``FileHandler.count_metadata``: an Arrow file's footer and batch
headers, a Megatron ``.idx``, a ``.pbin`` header and index, an MDS folder's
``index.json``, a Parquet footer); here they run many files at a time, through the root's
fsspec filesystem, retried. A format (or file) whose handler cannot is counted where a
shard opens it, which for a remote root downloads it: ``count_catalog`` says so once, with
the ``fmsdata index`` command that writes the counts file instead.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fmsdata.data import filecounts

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
Read = Callable[[str, int, int], bytes]
Counter = Callable[[Read, str, int, bool], "tuple[int, int] | None"]


def metadata_counter(handler: Any, path: str) -> Counter | None:
    """How to count ``path`` from its metadata with ``handler`` (its ``count_metadata``),
    or None: counted where it is opened."""
    own = getattr(handler, "count_metadata", None)
    return own if callable(own) else None


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


def first_lengths(
    root: str, storage: Any, relatives: Sequence[str], sizes: Sequence[int], handler: Any
) -> list[np.ndarray | None]:
    """The token counts of the first documents of remote files, from their metadata alone
    (range requests, ``THREADS`` files at a time): what settles, without downloading it,
    that a file holds a document long enough to be kept. None for a file whose format
    keeps no such metadata (Arrow, one record batch per document, does)."""
    from fmsdata.remote.retry import retrying

    lengths = getattr(handler, "first_lengths", None)
    if not callable(lengths) or not relatives:
        return [None] * len(relatives)
    fs, base = storage.filesystem(root)

    def read(path: str, start: int, end: int) -> bytes:
        url = root.rstrip("/") + path[len(base) :]
        return retrying(  # type: ignore[no-any-return]
            storage.retry, url, fs.cat_file, path, what="read", start=start, end=end
        )

    def one(job: tuple[str, int]) -> np.ndarray | None:
        relative, size = job
        return lengths(read, f"{base}/{relative}", int(size))

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(one, zip(relatives, sizes)))
