"""Arrow IPC files with one record batch per document (the fms-fsdp / Bamba layout)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from fmsdata.errors import ShardFormatError
from fmsdata.handlers.arrow_index import (
    RecordBatchIndex,
    batch_rows,
    footer_blocks,
    footer_length,
)
from fmsdata.handlers.base import MappedReaderHandler, pick_column
from fmsdata.handlers.mapping import MappedFile

__all__ = ["ArrowDocHandler", "arrow_file_problem", "write_arrow_docs"]


_MAGIC = b"ARROW1"
_STREAM_START = b"\xff\xff\xff\xff"  # an IPC stream's first message (continuation marker)


def arrow_file_problem(data: Any, err: Exception) -> str:
    """What is wrong with bytes pyarrow cannot open as an Arrow IPC file, said from its
    magic numbers: the file format begins and ends with ``ARROW1``, its footer (the
    record batch directory) last. A file that begins right but ends wrong was cut short;
    pyarrow says "Not an Arrow file" for both."""
    head, size = bytes(data[: len(_MAGIC)]), len(data)
    if size == 0:
        return "empty file (0 bytes), not an Arrow IPC file (cut or never written?)"
    if head == _MAGIC and bytes(data[size - len(_MAGIC) :]) != _MAGIC:
        return (
            f"truncated Arrow IPC file ({size:,} bytes): it begins with the {_MAGIC.decode()} "
            "magic but its end, the footer and closing magic, is missing (cut short, or its "
            "writing never finished)"
        )
    if head == _MAGIC:
        return f"damaged Arrow IPC file ({size:,} bytes; its footer does not read: {err})"
    if bytes(data[:4]) == _STREAM_START:
        return (
            "an Arrow IPC stream, not an Arrow IPC file (no footer to find documents by); "
            "read it with file_type='hf_arrow', or rewrite it with pyarrow.ipc.new_file"
        )
    return f"not an Arrow IPC file (it does not begin with the {_MAGIC.decode()} magic: {err})"


class _DocBatchReader:
    """An open, memory-mapped Arrow file plus the byte position of each document.

    Positions are filled in lazily, per block of documents the stream asks for, so opening
    a file with many documents costs only its footer.
    """

    def __init__(self, path: str, col_name: str) -> None:
        self.path = path
        self.mapped = MappedFile(path)
        try:
            self._ipc = pa.ipc.open_file(pa.py_buffer(self.mapped.bytes))
            schema = self._ipc.schema
            schema.names  # noqa: B018  (field names that are not UTF-8: damage)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
            problem = arrow_file_problem(self.mapped.bytes, err)
            raise ShardFormatError(f"{path}: {problem}") from None
        col_name = pick_column(path, schema.names, col_name)
        column_type = schema.field(col_name).type
        if not pa.types.is_integer(column_type):
            raise ShardFormatError(
                f"{path}: column {col_name!r} has type {column_type}, expected integer token ids "
                "(a list column means many documents per batch: use file_type='hf_arrow')"
            )
        self.col = schema.get_field_index(col_name)
        self.col_name = col_name
        self.dtype = np.dtype(column_type.to_pandas_dtype())
        self.n = self._ipc.num_record_batches
        self.flat = self.mapped.view(self.dtype)
        self._copies: dict[int, np.ndarray] = {}
        self.starts = np.full(self.n, -1, dtype=np.int64)  # element offset into flat, -1 unknown
        self.lengths = np.full(self.n, -1, dtype=np.int64)
        self._bytes = self.mapped.bytes
        self._index: RecordBatchIndex | None = None
        if all(
            pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
            for f in list(schema)[: self.col + 1]
        ):
            index = RecordBatchIndex.read(self._bytes)
            if index is not None and len(index) == self.n:
                self._index = index

    def locate(self, indices: np.ndarray) -> None:
        """Make sure start and length are known for the given documents."""
        missing = indices[self.starts[indices] < 0]
        if missing.size == 0:
            return
        if self._index is not None:
            missing = np.unique(missing)
            located = self._index.locate(self._bytes, missing, self.col, self.dtype.itemsize)
            if located is not None:
                self.starts[missing], self.lengths[missing] = located
                return
        base = self.flat.ctypes.data
        end = base + len(self._bytes)
        itemsize = self.dtype.itemsize
        for i in np.unique(missing):
            i = int(i)
            try:
                column = self._ipc.get_batch(i).column(self.col)
            except (pa.ArrowException, OSError) as err:
                raise ShardFormatError(
                    f"{self.path}: record batch {i} is unreadable ({err})"
                ) from None
            if column.null_count:
                raise ShardFormatError(
                    f"{self.path}: document {i} has {column.null_count} null token(s) in "
                    f"column {self.col_name!r}"
                )
            values = column.buffers()[1]
            n = len(column)
            if values is None:
                address = base  # empty document
            else:
                address = values.address + column.offset * itemsize
            inside = base <= address and address + n * itemsize <= end
            if inside and (address - base) % itemsize == 0:
                self.starts[i] = (address - base) // itemsize
            else:
                # Compressed or unaligned bodies are not views of the file: keep a copy.
                self._copies[i] = column.to_numpy(zero_copy_only=False)
                self.starts[i] = 0
            self.lengths[i] = n

    def doc(self, i: int) -> np.ndarray:
        if not 0 <= i < self.n:
            raise ShardFormatError(f"{self.path}: document {i} requested, the file holds {self.n}")
        if self.starts[i] < 0:
            self.locate(np.array([i], dtype=np.int64))
        if self._copies:
            copy = self._copies.get(i)
            if copy is not None:
                return copy
        start = int(self.starts[i])
        return self.flat[start : start + int(self.lengths[i])]

    def close(self) -> None:
        # No module globals here: a reader still open at interpreter exit is closed while
        # modules are being torn down (``np`` may already be None by then).
        self._bytes = self.mapped.close()
        self.flat = self._bytes.view(self.dtype)
        self._ipc = None
        self._copies = {}


_TAIL = 64 << 10  # first guess of a footer's size, read from the end of a file
_MERGE_GAP = 64 << 10  # batch headers closer than this are read as one range
_FIRST_DOCS = 16  # documents whose lengths ``first_lengths`` reads at most
_FIRST_SPAN = 256 << 10  # ... when their headers lie within this many bytes (else the first)


def _footer(
    read: Callable[[str, int, int], bytes], path: str, size: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The record batches' offsets and header lengths from a file's footer, read from its
    end (a second read where the footer is longer than the first guess)."""
    tail = read(path, max(0, size - _TAIL), size)
    need = footer_length(tail)
    if need is None:
        return None
    if need > len(tail):
        tail = read(path, max(0, size - need), size)
    return footer_blocks(np.frombuffer(tail, dtype=np.uint8))


class ArrowDocHandler(MappedReaderHandler):
    """Arrow IPC *file* format, one record batch per document, one integer token column.

    Documents are zero-copy views of the memory-mapped file.

    Args:
        col_name: Name of the token column (``tokens`` in the Bamba release; ``input_ids``
            occurs too).
    """

    name = "arrow"
    extensions = (".arrow",)
    described = ("col_name",)

    def __init__(self, col_name: str = "tokens") -> None:
        self.col_name = col_name

    def open(self, path: str) -> _DocBatchReader:
        return _DocBatchReader(path, self.col_name)

    def doc_lengths(self, reader: _DocBatchReader, indices: np.ndarray) -> np.ndarray:
        reader.locate(indices)
        return reader.lengths[indices]

    def token_buffer(
        self, reader: _DocBatchReader
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        # Documents are located on demand: callers locate (doc_lengths) before reading starts.
        if reader._copies:
            return None
        return reader.flat, reader.starts, reader.lengths

    def count_metadata(
        self, read: Callable[[str, int, int], bytes], path: str, size: int, tokens: bool
    ) -> tuple[int, int] | None:
        """The footer lists the record batches (documents); each batch's message header
        holds its row count (tokens), read only when tokens are asked for, in ranges merged
        where bodies are small."""
        blocks = _footer(read, path, size)
        if blocks is None:
            return None
        offsets, meta_lengths = blocks
        if not tokens or not len(offsets):
            return len(offsets), (0 if not len(offsets) else -1)
        starts, ends = offsets, offsets + meta_lengths
        cuts = np.flatnonzero(starts[1:] - ends[:-1] > _MERGE_GAP) + 1
        first = np.concatenate([[0], cuts])
        last = np.concatenate([cuts, [len(starts)]]) - 1
        total = 0
        for a, b in zip(first.tolist(), last.tolist()):
            data = np.frombuffer(read(path, int(starts[a]), int(ends[b])), dtype=np.uint8)
            rows = batch_rows(data, starts[a : b + 1] - starts[a])
            if rows is None:
                return None
            total += int(rows.sum())
        return len(offsets), total

    def first_lengths(
        self, read: Callable[[str, int, int], bytes], path: str, size: int
    ) -> np.ndarray | None:
        """Token counts of the file's first documents from its metadata: the footer, then
        the first batch headers (one range; only the first when they lie far apart)."""
        blocks = _footer(read, path, size)
        if blocks is None:
            return None
        offsets, meta_lengths = blocks
        k = min(len(offsets), _FIRST_DOCS)
        if not k:
            return np.zeros(0, dtype=np.int64)
        ends = offsets[:k] + meta_lengths[:k]
        k = max(1, int(np.searchsorted(ends - offsets[0], _FIRST_SPAN, side="right")))
        data = np.frombuffer(read(path, int(offsets[0]), int(ends[k - 1])), dtype=np.uint8)
        return batch_rows(data, offsets[:k] - offsets[0])


def write_arrow_docs(
    path: str, docs: Iterable[np.ndarray], col_name: str = "tokens", dtype: Any = np.uint32
) -> None:
    """Write documents (1-D integer arrays) as an Arrow IPC file, one record batch each.

    The file is written to ``path + ".tmp"`` and renamed, so a crash never leaves a
    truncated shard under the final name.
    """
    arrow_type = pa.from_numpy_dtype(np.dtype(dtype))
    schema = pa.schema([(col_name, arrow_type)])
    partial = f"{path}.tmp"
    with pa.OSFile(partial, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for doc in docs:
            array = pa.array(np.asarray(doc, dtype=dtype), type=arrow_type)
            writer.write_batch(pa.record_batch([array], schema=schema))
    os.replace(partial, path)
