"""Modalities packed data (``.pbin``): a header, all tokens back to back, a pickled index.

The index (``(byte offset, byte length)`` per document) is read by
``fmsdata.handlers.safe_pickle``, which never unpickles; tokens are views of the mapped file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fmsdata.errors import ShardFormatError
from fmsdata.handlers.base import FlatBuffer, FlatBufferHandler
from fmsdata.handlers.mapping import MappedFile
from fmsdata.handlers.safe_pickle import read_int_pairs

__all__ = ["PbinHandler"]

_HEADER = 12
_TOKEN_TYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _header(head: Any, size: int, path: str) -> tuple[int, int]:
    """``(data bytes, token size)`` of a ``.pbin`` of ``size`` bytes, from its header.

    Raises:
        ShardFormatError: Too short, an unknown token size, or a data section the file
            cannot hold.
    """
    head = np.frombuffer(head, dtype=np.uint8)
    if len(head) < _HEADER:
        raise ShardFormatError(f"{path}: too short for a .pbin header ({len(head)} bytes)")
    data_len = int(head[:8].view(np.uint64)[0])
    token_size = int(head[8:12].view(np.uint32)[0])
    if token_size not in _TOKEN_TYPES:
        raise ShardFormatError(f"{path}: token size {token_size} bytes, expected 1, 2 or 4")
    if _HEADER + data_len > size:
        raise ShardFormatError(
            f"{path}: truncated: the header announces {data_len} data bytes, the file holds "
            f"{size - _HEADER}"
        )
    return data_len, token_size


def _open_pbin(path: str) -> FlatBuffer:
    mapped = MappedFile(path)
    raw = mapped.bytes
    data_len, token_size = _header(raw[:_HEADER], len(raw), path)
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
    # Writers store documents back to back: the pairs tile the data section exactly.
    # Anything else is a damaged index that would serve other bytes as a document.
    ends = np.concatenate(([0], offsets + lengths))
    moved = offsets != ends[:-1]
    if len(pairs) and np.any(moved):
        row = int(np.argmax(moved))
        raise ShardFormatError(
            f"{path}: index does not tile the data section (document {row} starts at byte "
            f"{int(offsets[row])}, the one before ends at {int(ends[row])})"
        )
    if int(ends[-1]) != data_len:
        raise ShardFormatError(
            f"{path}: index covers {int(ends[-1])} of the {data_len}-byte data section"
        )
    flat = mapped.view(np.dtype(_TOKEN_TYPES[token_size]), _HEADER, data_len // token_size)
    return FlatBuffer(path, flat, offsets // token_size, lengths // token_size, [mapped])


class PbinHandler(FlatBufferHandler):
    """Modalities ``.pbin`` files. Documents keep their end-of-document token; a loader
    with ``eos_token`` set replaces it rather than adding a second one."""

    name = "pbin"
    extensions = (".pbin",)
    documents_end_with_eos = True

    def open(self, path: str) -> FlatBuffer:
        return _open_pbin(path)

    def count_metadata(
        self, read: Callable[[str, int, int], bytes], path: str, size: int, tokens: bool
    ) -> tuple[int, int] | None:
        """The header, then the index after the data section (never the tokens)."""
        data_len, token_size = _header(read(path, 0, _HEADER), size, path)
        pairs = read_int_pairs(read(path, _HEADER + data_len, size), f"{path} (index)")
        return len(pairs), int(pairs[:, 1].sum()) // token_size if len(pairs) else 0
