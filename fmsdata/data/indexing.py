"""Count the documents and tokens of every shard of a root into ``meta/counts.csv``.

A remote root is counted from the files' metadata with range requests where the format
keeps its counts there (``fmsdata.data.metacount``), in parallel; only files of formats that do
not are pulled through the local cache and opened.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from fmsdata.data import filecounts
from fmsdata.data.catalog import COUNTS_HEADER, META_DIR, discover
from fmsdata.data.metacount import count_files, logged_progress
from fmsdata.handlers.base import FileHandler
from fmsdata.handlers.derived import default_cache_dir
from fmsdata.remote.cache import file_source
from fmsdata.remote.retry import retrying
from fmsdata.remote.storage import Storage, is_local
from fmsdata.util.urls import local_path, location

__all__ = ["index_root", "write_counts"]


CACHE_LIMIT = 64 << 30


def _count(job: tuple[FileHandler, str, str, Storage, str]) -> tuple[str, int, int]:
    handler, root, relative, storage, cache_dir = job
    source = file_source(root, storage, cache_dir, CACHE_LIMIT, handler.companions)
    try:
        docs, tokens = handler.count(source.local(relative))
    finally:
        source.release(relative)
        source.close()
    return relative, docs, tokens


def index_root(
    root: str,
    handler: FileHandler,
    datasets: Sequence[str] | None = None,
    workers: int = 1,
    on_file: Callable[[], None] | None = None,
    storage: Storage | None = None,
    cache_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[str, list[tuple[str, int, int]]]:
    """Count every shard of ``root`` (in ``workers`` processes) and write the counts file.

    Files of a remote root are counted from their metadata (range requests; each footer
    read once); those whose format keeps no counts there are pulled through the local
    cache (``cache_dir``) and opened. ``on_file()`` and ``progress(done, total)`` are
    called as each file is counted (the CLI draws a bar; a long listing is also logged).

    Returns:
        The path written and its rows ``(dataset/relative/path, documents, tokens)``.
    """
    root = location(root, "index_root(root)", write=True)
    storage = storage or Storage()
    cache_dir = (
        local_path(cache_dir, "index_root(cache_dir)")
        if cache_dir
        else os.path.join(default_cache_dir(), "remote")
    )
    catalog = discover(root, datasets, handler, storage, count=False)
    jobs = [
        (handler, catalog.root, rel, storage, cache_dir)
        for ds in catalog.datasets
        for rel in ds.paths
    ]
    order = {job[2]: i for i, job in enumerate(jobs)}
    rows: list[tuple[str, int, int]] = []
    total, done = len(jobs), [0]
    report = logged_progress(progress, f"indexing {root}")

    def counted() -> None:
        done[0] += 1
        if on_file is not None:
            on_file()
        report(done[0], total)

    fs, _ = storage.filesystem(catalog.root)
    if not is_local(fs):
        rows, jobs = _count_from_metadata(catalog, handler, storage, jobs, counted)
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            for row in pool.map(_count, jobs, chunksize=8):
                rows.append(row)
                counted()
    else:
        for job in jobs:
            rows.append(_count(job))
            counted()
    rows.sort(key=lambda row: order[row[0]])  # catalog order, however they were counted
    return write_counts(catalog.root, rows, storage=storage), rows


def _count_from_metadata(
    catalog: Any,
    handler: FileHandler,
    storage: Storage,
    jobs: list[tuple[FileHandler, str, str, Storage, str]],
    on_file: Callable[[], None] | None,
) -> tuple[list[tuple[str, int, int]], list[tuple[FileHandler, str, str, Storage, str]]]:
    """Rows of the files counted from their metadata, and the jobs left (whole files)."""
    fs, base = storage.filesystem(catalog.root)
    root = catalog.root.rstrip("/")

    def read(path: str, start: int, end: int) -> bytes:
        url = root + path[len(base) :]
        if end < 0:
            return retrying(storage.retry, url, fs.cat_file, path, what="read")  # type: ignore[no-any-return]
        return retrying(  # type: ignore[no-any-return]
            storage.retry, url, fs.cat_file, path, start=start, end=end, what="read"
        )

    sizes = {rel: int(size) for ds in catalog.datasets for rel, size in zip(ds.paths, ds.sizes)}
    relatives = [job[2] for job in jobs]
    found = count_files(
        base,
        relatives,
        [sizes[rel] for rel in relatives],
        handler,
        read,
        tokens=True,
        progress=None if on_file is None else lambda done, total: on_file(),
    )
    rows, left = [], []
    for job, counts in zip(jobs, found):
        if counts is None or counts[1] < 0:
            left.append(job)
            continue
        rows.append((job[2], counts[0], counts[1]))
        filecounts.remember(root, job[2], sizes[job[2]], counts[0], counts[1])
    return rows, left


def write_counts(
    root: str,
    rows: Sequence[tuple[str, int, int]],
    name: str = "counts.csv",
    storage: Storage | None = None,
) -> str:
    """Write rows as ``<root>/meta/<name>`` (leading-slash paths, as in the Bamba release).

    Written to a temporary name and moved into place, so readers never see half a file.
    """
    fs, base = (storage or Storage()).filesystem(root)
    fs.makedirs(f"{base}/{META_DIR}", exist_ok=True)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COUNTS_HEADER)
    for rel, docs, tokens in rows:
        writer.writerow((f"/{rel}", docs, tokens))
    target = f"{base}/{META_DIR}/{name}"
    partial = f"{target}.tmp"
    with fs.open(partial, "w", encoding="utf-8") as out:
        out.write(text.getvalue())
    fs.mv(partial, target)
    return target
