"""Modalities packed data (``.pbin``): a header, all tokens back to back, a pickled index.

The index (``(byte offset, byte length)`` per document) is read by
``fmsdata.handlers.safe_pickle``, which never unpickles; tokens are views of the mapped file.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fmsdata.errors import ShardFormatError
from fmsdata.handlers.base import FileHandler
from fmsdata.handlers.mapping import MappedFile
from fmsdata.handlers.safe_pickle import read_int_pairs

__all__ = ["PbinHandler"]

_HEADER = 12
_TOKEN_TYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32}


class _PackedReader:
    def __init__(self, path: str):
        self.path = path
        self.mapped = MappedFile(path)
        raw = self.mapped.bytes
        if len(raw) < _HEADER:
            raise ShardFormatError(f"{path}: too short for a .pbin header ({len(raw)} bytes)")
        data_len = int(raw[:8].view(np.uint64)[0])
        token_size = int(raw[8:12].view(np.uint32)[0])
        if token_size not in _TOKEN_TYPES:
            raise ShardFormatError(f"{path}: token size {token_size} bytes, expected 1, 2 or 4")
        if _HEADER + data_len > len(raw):
            raise ShardFormatError(
                f"{path}: truncated: the header announces {data_len} data bytes, the file holds "
                f"{len(raw) - _HEADER}"
            )
        pairs = read_int_pairs(raw[_HEADER + data_len :].data, f"{path} (index)")
        offsets, lengths = pairs[:, 0], pairs[:, 1]
        if len(pairs) and (
            offsets.min() < 0
            or lengths.min() < 0
            or np.any(offsets % token_size)
            or np.any(lengths % token_size)
        ):
            raise ShardFormatError(f"{path}: index has negative or misaligned document offsets")
        if len(pairs) and int((offsets + lengths).max()) > data_len:
            raise ShardFormatError(
                f"{path}: index points past the end of the {data_len}-byte data section"
            )
        self.dtype = np.dtype(_TOKEN_TYPES[token_size])
        self.flat = self.mapped.view(self.dtype, offset=_HEADER, count=data_len // token_size)
        self.starts = offsets // token_size
        self.lengths = lengths // token_size
        self.n = len(pairs)


class PbinHandler(FileHandler):
    """Modalities ``.pbin`` files (documents keep their end-of-document token: strip it with
    ``strip_tokens`` if the loader adds its own EOS)."""

    name = "pbin"
    extensions = (".pbin",)

    def open(self, path: str) -> _PackedReader:
        return _PackedReader(path)

    def num_docs(self, reader: _PackedReader) -> int:
        return reader.n

    def get(self, reader: _PackedReader, index: int) -> np.ndarray:
        if not 0 <= index < reader.n:
            raise ShardFormatError(
                f"{reader.path}: document {index} requested, the index holds {reader.n}"
            )
        start = int(reader.starts[index])
        return reader.flat[start : start + int(reader.lengths[index])]

    def doc_lengths(self, reader: _PackedReader, indices: np.ndarray) -> np.ndarray:
        return reader.lengths[indices]

    def token_buffer(self, reader: _PackedReader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return reader.flat, reader.starts, reader.lengths

    def release(self, reader: _PackedReader) -> None:
        reader.mapped.release()

    def describe(self) -> dict[str, Any]:
        return {"file_type": self.name}
