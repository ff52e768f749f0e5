"""Count the documents and tokens of every shard of a root into ``meta/counts.csv``."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from fmsdata.catalog import COUNTS_HEADER, META_DIR, discover
from fmsdata.handlers.base import FileHandler
from fmsdata.handlers.derived import default_cache_dir
from fmsdata.remote.cache import file_source
from fmsdata.remote.storage import Storage

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
) -> tuple[str, list[tuple[str, int, int]]]:
    """Count every shard of ``root`` (in ``workers`` processes) and write the counts file.

    Files of a remote root are pulled through the local cache (``cache_dir``) to be read.

    Returns:
        The path written and its rows ``(dataset/relative/path, documents, tokens)``.
    """
    storage = storage or Storage()
    cache_dir = cache_dir or os.path.join(default_cache_dir(), "remote")
    catalog = discover(root, datasets, handler, storage)
    jobs = [
        (handler, catalog.root, rel, storage, cache_dir)
        for ds in catalog.datasets
        for rel in ds.paths
    ]
    rows = []
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            for row in pool.map(_count, jobs, chunksize=8):
                rows.append(row)
                if on_file is not None:
                    on_file()
    else:
        for job in jobs:
            rows.append(_count(job))
            if on_file is not None:
                on_file()
    return write_counts(catalog.root, rows, storage=storage), rows


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
