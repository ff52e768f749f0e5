"""Count the documents and tokens of every shard of a root into ``meta/counts.csv``."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

import fsspec

from fmsdata.catalog import COUNTS_HEADER, META_DIR, discover
from fmsdata.files import local_path_resolver
from fmsdata.handlers.base import FileHandler

__all__ = ["index_root", "write_counts"]


def _count(job: tuple[FileHandler, str, str]) -> tuple[str, int, int]:
    handler, root, relative = job
    docs, tokens = handler.count(local_path_resolver(root)(relative))
    return relative, docs, tokens


def index_root(
    root: str,
    handler: FileHandler,
    datasets: Sequence[str] | None = None,
    workers: int = 1,
    on_file: Callable[[], None] | None = None,
) -> tuple[str, list[tuple[str, int, int]]]:
    """Count every shard of ``root`` (in ``workers`` processes) and write the counts file.

    Returns:
        The path written and its rows ``(dataset/relative/path, documents, tokens)``.
    """
    catalog = discover(root, datasets, handler)
    jobs = [(handler, catalog.root, rel) for ds in catalog.datasets for rel in ds.paths]
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
    return write_counts(catalog.root, rows), rows


def write_counts(root: str, rows: Sequence[tuple[str, int, int]], name: str = "counts.csv") -> str:
    """Write rows as ``<root>/meta/<name>`` (leading-slash paths, as in the Bamba release).

    Written to a temporary name and moved into place, so readers never see half a file.
    """
    fs, base = fsspec.core.url_to_fs(root)
    base = base.rstrip("/")
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
