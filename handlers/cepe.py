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

from typing import Any

import numpy as np

from fmsdata.errors import ShardFormatError
from fmsdata.handlers.base import FileHandler
from fmsdata.handlers.mapping import MappedFile
from fmsdata.handlers.npy_header import parse_npy_header

__all__ = ["CepeHandler"]


class _CountedReader:
    def __init__(self, path: str):
        self.path = path
        self.mapped = MappedFile(path)
        raw = self.mapped.bytes
        header = parse_npy_header(raw, path)
        header.check_size(len(raw), path)
        if header.dtype.kind not in "iu" or len(header.shape) != 1:
            raise ShardFormatError(
                f"{path}: a CEPE file holds one 1-D integer array, this one "
                f"{header.dtype.str} of shape {header.shape}"
            )
        self.flat = self.mapped.view(header.dtype, offset=header.offset, count=header.count)
        size = len(self.flat)
        if size < 1:
            raise ShardFormatError(f"{path}: empty array: no document count")
        n = int(self.flat[0])
        if n < 0 or 1 + n > size:
            raise ShardFormatError(
                f"{path}: document count {n} does not fit the array of {size} values"
            )
        self.lengths = np.asarray(self.flat[1 : 1 + n], dtype=np.int64)
        if n and int(self.lengths.min()) < 0:
            bad = int(np.flatnonzero(self.lengths < 0)[0])
            raise ShardFormatError(f"{path}: document {bad} has length {int(self.lengths[bad])}")
        total = 1 + n + int(self.lengths.sum())
        if total != size:
            raise ShardFormatError(
                f"{path}: count {n} and its lengths need 1 + {n} + {total - 1 - n} = {total} "
                f"values, the array holds {size} (not a CEPE counted file, or damaged)"
            )
        self.starts = np.zeros(n, dtype=np.int64)
        if n:
            np.cumsum(self.lengths[:-1], out=self.starts[1:])
        self.starts += 1 + n
        self.n = n


class CepeHandler(FileHandler):
    """CEPE counted ``.npy`` files (``file_type: cepe``; never chosen by ``auto``, whose
    ``.npy`` files are flat token streams)."""

    name = "cepe"
    extensions = (".npy",)

    def open(self, path: str) -> _CountedReader:
        return _CountedReader(path)

    def num_docs(self, reader: _CountedReader) -> int:
        return reader.n

    def get(self, reader: _CountedReader, index: int) -> np.ndarray:
        if not 0 <= index < reader.n:
            raise ShardFormatError(
                f"{reader.path}: document {index} requested, the file holds {reader.n}"
            )
        start = int(reader.starts[index])
        return reader.flat[start : start + int(reader.lengths[index])]

    def doc_lengths(self, reader: _CountedReader, indices: np.ndarray) -> np.ndarray:
        return reader.lengths[indices]

    def token_buffer(self, reader: _CountedReader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return reader.flat, reader.starts, reader.lengths

    def release(self, reader: _CountedReader) -> None:
        reader.mapped.release()

    def describe(self) -> dict[str, Any]:
        return {"file_type": self.name}
