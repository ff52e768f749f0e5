"""Megatron indexed datasets: ``PREFIX.idx`` (index) + ``PREFIX.bin`` (tokens).

The index is parsed with numpy (layout in ``FORMATS.md``) and checked against the token
file; a document is the run of its sequences, contiguous in the memory-mapped ``.bin``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.base import FlatBuffer, FlatBufferHandler
from fmsdata.handlers.mapping import MappedFile

__all__ = ["MegatronHandler", "MegatronIndex", "MEGATRON_DTYPES", "parse_index", "write_megatron"]

MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}


@dataclasses.dataclass(frozen=True)
class MegatronIndex:
    """A parsed ``.idx``: the token dtype, each sequence's length and byte pointer, and the
    document index (``doc_index[d]`` is document ``d``'s first sequence; one more at the
    end)."""

    dtype: np.dtype
    lengths: np.ndarray
    pointers: np.ndarray
    doc_index: np.ndarray

    @property
    def documents(self) -> int:
        return len(self.doc_index) - 1

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


def parse_index(data: bytes, idx_path: str) -> MegatronIndex:
    """The index in ``data`` (a whole ``.idx`` file), checked: magic, version, an integer
    token type, its length, and a document index that covers its sequences in order.

    Raises:
        ShardFormatError: Naming ``idx_path`` and what is wrong.
    """
    if len(data) < 34 or data[:9] != MAGIC:
        raise ShardFormatError(f"{idx_path}: not a Megatron index (bad magic {data[:9]!r})")
    version = int(np.frombuffer(data, np.uint64, 1, 9)[0])
    if version != 1:
        raise ShardFormatError(f"{idx_path}: index version {version}, expected 1")
    code = data[17]
    if code not in MEGATRON_DTYPES or code in (6, 7):
        raise ShardFormatError(f"{idx_path}: dtype code {code} is not an integer token type")
    sequences = int(np.frombuffer(data, np.uint64, 1, 18)[0])
    doc_count = int(np.frombuffer(data, np.uint64, 1, 26)[0])
    body = memoryview(data)[34:]
    need = 12 * sequences + 8 * doc_count
    if len(body) < need:
        raise ShardFormatError(
            f"{idx_path}: truncated index ({len(body)} bytes after the header, {need} expected)"
        )
    lengths = np.frombuffer(body, np.int32, sequences, 0).astype(np.int64)
    pointers = np.frombuffer(body, np.int64, sequences, 4 * sequences)
    doc_index = np.frombuffer(body, np.int64, doc_count, 12 * sequences)
    if (
        doc_count < 1
        or doc_index[0] != 0
        or doc_index[-1] != sequences
        or np.any(np.diff(doc_index) < 0)
    ):
        raise ShardFormatError(
            f"{idx_path}: document index does not cover the {sequences} sequences"
        )
    return MegatronIndex(np.dtype(MEGATRON_DTYPES[code]), lengths, pointers, doc_index)


class _IndexedReader(FlatBuffer):
    def __init__(self, idx_path: str):
        bin_path = idx_path[: -len(".idx")] + ".bin"
        try:
            with open(idx_path, "rb") as handle:
                index = parse_index(handle.read(), idx_path)
        except OSError as err:
            raise ShardFormatError(f"{idx_path}: unreadable ({err})") from None
        lengths, pointers, doc_index = index.lengths, index.pointers, index.doc_index
        sequences, itemsize = len(lengths), index.dtype.itemsize
        if not os.path.exists(bin_path):
            raise ShardFormatError(f"{idx_path}: its token file {bin_path} is missing")
        bin_size = os.path.getsize(bin_path)
        if sequences and (lengths.min() < 0 or pointers.min() < 0 or np.any(pointers % itemsize)):
            raise ShardFormatError(f"{idx_path}: negative or misaligned sequence length or pointer")
        # Element offset of each sequence (and of the end): sequences lie back to back.
        offsets = np.zeros(sequences + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if not np.array_equal(pointers, offsets[:-1] * itemsize):
            raise ShardFormatError(
                f"{idx_path}: sequence pointers are not back to back in {bin_path}"
            )
        end = int(offsets[-1]) * itemsize
        if end > bin_size:
            raise ShardFormatError(
                f"{idx_path}: index points past the end of {bin_path} ({end} > {bin_size} bytes)"
            )
        starts = offsets[doc_index[:-1]]
        mapped = MappedFile(bin_path) if bin_size else None
        flat = mapped.view(index.dtype) if mapped else np.zeros(0, index.dtype)
        super().__init__(idx_path, flat, starts, offsets[doc_index[1:]] - starts, [mapped])


class MegatronHandler(FlatBufferHandler):
    """Megatron ``.bin`` / ``.idx`` pairs; a shard is named by its ``.idx`` file."""

    name = "megatron"
    extensions = (".idx",)

    @classmethod
    def select(cls, paths: list[str]) -> list[str]:
        present = set(paths)
        return [p for p in paths if p.endswith(".idx") and p[: -len(".idx")] + ".bin" in present]

    @classmethod
    def companions(cls, path: str) -> list[str]:
        return [path[: -len(".idx")] + ".bin"]

    def open(self, path: str) -> _IndexedReader:
        return _IndexedReader(path)

    def count_metadata(
        self, read: Callable[[str, int, int], bytes], path: str, size: int, tokens: bool
    ) -> tuple[int, int] | None:
        """The ``.idx`` holds both counts (the ``.bin`` is never read)."""
        index = parse_index(read(path, 0, size), path)
        return index.documents, index.tokens


def write_megatron(prefix: str, docs: Any, dtype: Any = np.uint16) -> None:
    """Write documents as ``prefix.bin`` + ``prefix.idx``, one sequence per document (the
    layout of Megatron's GPT preprocessing); each file goes to a temporary name first."""
    dtype = np.dtype(dtype)
    codes = {np.dtype(v): k for k, v in MEGATRON_DTYPES.items()}
    if dtype not in codes:
        raise ConfigError(f"Megatron files cannot hold {dtype.name} tokens")
    lengths = []
    with open(prefix + ".bin.tmp", "wb") as out:
        for doc in docs:
            array = np.asarray(doc, dtype=dtype)
            out.write(array.tobytes())
            lengths.append(len(array))
    sizes = np.asarray(lengths, dtype=np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    doc_index = np.arange(len(sizes) + 1, dtype=np.int64)
    with open(prefix + ".idx.tmp", "wb") as out:
        out.write(MAGIC)
        out.write(np.uint64(1).tobytes())
        out.write(bytes([codes[dtype]]))
        out.write(np.uint64(len(sizes)).tobytes())
        out.write(np.uint64(len(doc_index)).tobytes())
        out.write(sizes.tobytes())
        out.write(pointers.tobytes())
        out.write(doc_index.tobytes())
    os.replace(prefix + ".bin.tmp", prefix + ".bin")
    os.replace(prefix + ".idx.tmp", prefix + ".idx")
