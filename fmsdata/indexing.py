"""Write the counts metadata of a data root (``meta/counts.csv``)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

import fsspec

from fmsdata.catalog import COUNTS_HEADER, META_DIR

__all__ = ["write_counts"]


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
