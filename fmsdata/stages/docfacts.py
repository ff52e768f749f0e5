"""What a saved span's document is, measured from its files as the line writer measures
it: its decorated length and where its kept tokens start (``document_facts``). Shared by
the check of saved spans before a resume (``fmsdata.worker.spancheck``) and the shuffle buffer's
restored lines (``fmsdata.stages.savedlines``); it lives among the stages, with no import
of the modules that use it, so importing either first works."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError
from fmsdata.stages.spans import DOC, FILE

__all__ = ["document_facts"]


def document_facts(
    spans: np.ndarray,
    rows: np.ndarray,
    access: Any,
    decoration: Any,
    refuse: Callable[[str, int, str], StateMismatchError],
    measure: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The decorated length and the first kept token in the file's flat buffer (-1: none)
    of the document each span ``spans[rows]`` names (all of one dataset), measured from
    its files as the line writer measures them; ``refuse(field, span, message)`` makes the
    error for a span naming a file past the dataset's (field ``"file"``) or a document past
    its file's (``"doc"``). Without ``measure`` only those two are checked (from the
    document counts, opening no file) and the facts returned are -1."""
    files = spans[rows, FILE]
    past = rows[files >= access.num_files]
    if len(past):
        i = int(past[0])
        raise refuse(
            "file",
            i,
            f"names file {spans[i, FILE]}, past the {access.num_files} file(s) of its dataset",
        )
    dlen = np.empty(len(rows), dtype=np.int64)
    base = np.empty(len(rows), dtype=np.int64)
    for file in np.unique(files).tolist():
        at = np.flatnonzero(files == file)
        docs = spans[rows[at], DOC]
        count = access.doc_count(file)
        beyond = rows[at][docs >= count]
        if len(beyond):
            i = int(beyond[0])
            raise refuse(
                "doc",
                i,
                f"names document {spans[i, DOC]} of {access.path(file)}, which holds {count}",
            )
        if not measure:
            dlen[at] = base[at] = -1
            continue
        unique, inverse = np.unique(docs, return_inverse=True)
        lengths, lead, trail, starts = access.measure(file, unique, decoration)
        dlen[at] = (lengths - lead - trail + decoration.extra)[inverse]
        base[at] = -1 if starts is None else (starts + lead)[inverse]
    return dlen, base
