"""Write the counts metadata of a data root (``meta/counts.csv``)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence

import fsspec

from fmsdata.catalog import COUNTS_HEADER, META_DIR, Catalog
from fmsdata.files import local_path_resolver
from fmsdata.handlers.base import FileHandler

__all__ = ["count_files", "write_counts"]


def count_files(
    catalog: Catalog, handler: FileHandler, progress: Callable[[int], None] | None = None
) -> list[tuple[str, int, int]]:
    """``(dataset/relative/path, documents, tokens)`` for every shard of the catalog."""
    local = local_path_resolver(catalog.root)
    rows = []
    for ds in catalog.datasets:
        for rel in ds.paths:
            docs, tokens = handler.count(local(rel))
            rows.append((rel, docs, tokens))
            if progress is not None:
                progress(1)
    return rows


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
