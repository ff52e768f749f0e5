"""CEPE's counted ``.npy`` files (its RedPajama preparation): one per input file.

Written with ``np.save`` of one 1-D integer array (int64 in CEPE's code) laid out as
``[n, len_1, ..., len_n, tokens of document 1, ..., tokens of document n]``. The dtype
comes from the ``.npy`` header (``npy_header``, parsed without eval); document ``i`` starts
at ``1 + n + len_1 + ... + len_{i-1}``. The count and lengths look like tokens, so this
layout has its own ``file_type`` (``cepe``): read as a flat stream it would serve them as
tokens without any error. A file whose count and lengths do not add up to its size is a
``ShardFormatError``.
"""

from __future__ import annotations

import numpy as np

from fmsdata.errors import ShardFormatError
from fmsdata.handlers.base import FlatBuffer, FlatBufferHandler
from fmsdata.handlers.mapping import MappedFile
from fmsdata.handlers.npy_header import parse_npy_header

__all__ = ["CepeHandler"]


def _open_counted(path: str) -> FlatBuffer:
    mapped = MappedFile(path)
    raw = mapped.bytes
    header = parse_npy_header(raw, path)
    header.check_size(len(raw), path)
    if header.dtype.kind not in "iu" or len(header.shape) != 1:
        raise ShardFormatError(
            f"{path}: a CEPE file holds one 1-D integer array, this one "
            f"{header.dtype.str} of shape {header.shape}"
        )
    flat = mapped.view(header.dtype, offset=header.offset, count=header.count)
    size = len(flat)
    if size < 1:
        raise ShardFormatError(f"{path}: empty array: no document count")
    n = int(flat[0])
    if n < 0 or 1 + n > size:
        raise ShardFormatError(
            f"{path}: document count {n} does not fit the array of {size} values"
        )
    lengths = np.asarray(flat[1 : 1 + n], dtype=np.int64)
    if n and int(lengths.min()) < 0:
        bad = int(np.flatnonzero(lengths < 0)[0])
        raise ShardFormatError(f"{path}: document {bad} has length {int(lengths[bad])}")
    total = 1 + n + int(lengths.sum())
    if total != size:
        raise ShardFormatError(
            f"{path}: count {n} and its lengths need 1 + {n} + {total - 1 - n} = {total} "
            f"values, the array holds {size} (not a CEPE counted file, or damaged)"
        )
    starts = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(lengths[:-1], out=starts[1:])
    return FlatBuffer(path, flat, starts + 1 + n, lengths, [mapped])


class CepeHandler(FlatBufferHandler):
    """CEPE counted ``.npy`` files (``file_type: cepe``; never chosen by ``auto``, whose
    ``.npy`` files are flat token streams)."""

    name = "cepe"
    extensions = (".npy",)

    def open(self, path: str) -> FlatBuffer:
        return _open_counted(path)
