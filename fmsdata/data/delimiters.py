"""Delimiters a file already stores that the loader would add again.

A loader with ``eos_token`` (``bos_token``) set adds it after (before) every document. Where
a root says its documents already carry it (``metadata.json``, or a format that always
stores it: ``file_type`` ``npy`` / ``pbin``), ``fmsdata.data.rootconfig`` lists it in
``strip_tokens`` so the added one replaces the stored one. Anywhere else (a root without
``metadata.json``, ``file_type: auto``, Megatron data written with ``--append-eod``, a
tokenizer that added its BOS), only the documents can tell, and a doubled delimiter is
silent in every batch. So the first time a worker measures a file it looks at the edges of
a few documents spread over it (``SAMPLE``, from the open reader: no extra read) and
refuses the config when most of them already end (start) with the token it would add.

It refuses rather than strips: the config a user wrote, and the fingerprint of every state
saved with it, keep meaning the stream they meant; the fix is one line, and the error
names it. Which fix is right (replace the stored token, or keep it and add none) is the
user's to say.

The map-style dataset (``fmsdata.mapstyle.files.check_stored_eos``) samples and decides the
same way (``sample_edges``, ``most_carry``), with its own fix: ``documents_end_with_eos``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fmsdata.errors import ConfigError
from fmsdata.handlers.base import FileHandler

__all__ = ["SAMPLE", "check_stored_delimiters", "sample_edges", "most_carry"]

SAMPLE = 16  # documents looked at per file, spread evenly over it


def check_stored_delimiters(
    handler: FileHandler,
    reader: Any,
    path: str,
    bos: int | None,
    eos: int | None,
    strip: frozenset[int],
) -> None:
    """Refuse to add a delimiter that most sampled documents of ``path`` already carry.

    Args:
        handler, reader: The file's handler and its open reader.
        path: The file, for the message.
        bos, eos: The tokens the loader adds (None: not added).
        strip: ``strip_tokens``: a token listed there is replaced, never doubled.

    Raises:
        ConfigError: Naming the file, the field, its value and the two fixes.
    """
    checks = [
        (field, token, side)
        for field, token, side in (("eos_token", eos, "end"), ("bos_token", bos, "start"))
        if token is not None and token not in strip
    ]
    if not checks:
        return
    first, last = sample_edges(handler, reader)
    for field, token, side in checks:
        found = most_carry(last if side == "end" else first, token)
        if found:
            raise ConfigError(
                _message(handler, reader, path, field, token, side, found, len(first))
            )


def sample_edges(handler: FileHandler, reader: Any) -> tuple[np.ndarray, np.ndarray]:
    """First and last tokens of the non-empty documents among up to ``SAMPLE`` spread
    evenly over an open file (empty arrays for a file of no documents)."""
    n = handler.num_docs(reader)
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    docs = np.unique(np.linspace(0, n - 1, min(n, SAMPLE)).astype(np.int64))
    first, last = handler.doc_edges(reader, docs)
    present = first >= 0  # empty documents have no edges
    return first[present], last[present]


def most_carry(edges: np.ndarray, token: int) -> int:
    """How many of the sampled ``edges`` are ``token`` when that is most of them (more
    than half), else 0: the rule by which a stored delimiter is taken to be there."""
    found = int((edges == token).sum())
    return found if 2 * found > len(edges) else 0


def _message(
    handler: FileHandler,
    reader: Any,
    path: str,
    field: str,
    token: int,
    side: str,
    found: int,
    looked: int,
) -> str:
    where = "after" if side == "end" else "before"
    text = (
        f"{path}: {found} of {looked} sampled documents already {side} with {field}={token}, "
        f"and the loader adds {field} {where} every document: each would {side} with it "
        f"twice. Set strip_tokens: [{token}] to keep one per document (the stored one is "
        f"replaced), or {field}: null to keep the stored ones and add none"
    )
    stored = handler.reader_format(reader)
    if side == "end" and stored.documents_end_with_eos and handler.name != stored.name:
        text += f" (file_type: {stored.name} does the first by itself)"
    return text
