"""Saved spans checked against the data before a resume runs.

A shard state holds spans ``(dataset, file, doc, start, length)``: buffered lines, a
packer's carry (length 0: to the end of the document, ``fmsdata.stages.savedlines``).
A damaged or foreign state can name a dataset the state does not list, a
file past a dataset's files, a document past a file's documents, or tokens past a
document's end. Each would fail deep inside a worker (an ``IndexError``) or, worse, make
a line of other tokens. Here every span is checked against the files themselves, with the
document lengths measured as the line writer will measure them, before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError
from fmsdata.stages.docfacts import document_facts
from fmsdata.stages.spans import DOC, DS, FILE, LENGTH, SAVED_SPAN_WIDTH, START
from fmsdata.util.statecheck import fail

__all__ = ["check_saved_spans"]


def check_saved_spans(
    spans: np.ndarray,
    where: str,
    space: Sequence[str],
    accesses: Mapping[str, Any],
    decoration: Any,
    measure: bool = True,
) -> None:
    """Raise StateMismatchError (path ``where``, the span, the limit) for the first span of
    ``spans`` that does not fit the data.

    With ``measure`` off only what the catalog's counts tell is checked (dataset, file,
    document): no file is opened, and a span's end is left to the reader of its file.

    Args:
        spans: ``[n, SAVED_SPAN_WIDTH]`` saved spans of one shard state.
        where: The path of that shard state.
        space: The dataset names the spans' dataset field indexes (``span_datasets``).
        accesses: Dataset name -> ``DatasetAccess``; datasets missing here are not
            checked against files (they are no longer listed).
        decoration: The ``Decoration`` documents are measured with.
    """
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, SAVED_SPAN_WIDTH)
    if not len(spans):
        return

    def refuse(i: int, message: str) -> StateMismatchError:
        return fail(
            where,
            f"saved span {spans[i].tolist()} (dataset, file, doc, start, length; length 0: "
            f"to the end) {message}",
        )

    negative = np.flatnonzero((spans < 0).any(axis=1))
    if len(negative):
        raise refuse(int(negative[0]), "holds a negative field")
    outside = np.flatnonzero(spans[:, DS] >= len(space))
    if len(outside):
        raise refuse(
            int(outside[0]),
            f"names dataset {spans[outside[0], DS]}; the state lists {len(space)}: {list(space)}",
        )
    for ds in np.unique(spans[:, DS]).tolist():
        access = accesses.get(space[ds])
        if access is None:
            continue
        rows = np.flatnonzero(spans[:, DS] == ds)
        dlen, _ = document_facts(
            spans, rows, access, decoration, lambda _field, i, message: refuse(i, message), measure
        )
        if not measure:
            continue
        starts, ends = spans[rows, START], spans[rows, LENGTH]
        ends = np.where(ends == 0, dlen, starts + ends)  # length 0: to the end
        long = np.flatnonzero((ends > dlen) | (starts >= dlen))
        if len(long):
            i = int(rows[long[0]])
            raise refuse(
                i,
                f"ends past its document ({access.path(int(spans[i, FILE]))}, document "
                f"{spans[i, DOC]} has {int(dlen[long[0]])} tokens with BOS/EOS)",
            )
