"""Arrow files with many documents per record batch (Hugging Face ``datasets`` cache).

IPC *stream* or *file* format; each row is a document, its tokens a ``list`` or
``large_list`` of integers. All batches are read once (metadata only, the file is memory
mapped), and each document's tokens are located in the flat values buffers, so documents
are zero-copy views and lines are copied straight from the mapped file.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from fmsdata.errors import ShardFormatError
from fmsdata.handlers.arrow import arrow_file_problem
from fmsdata.handlers.base import MappedReaderHandler, pick_column
from fmsdata.handlers.mapping import MappedFile

__all__ = ["HFArrowHandler"]


class _RowsReader:
    def __init__(self, path: str, col_name: str):
        self.path = path
        self.mapped = MappedFile(path)
        source = pa.py_buffer(self.mapped.bytes)
        file_format = bytes(self.mapped.bytes[:6]) == b"ARROW1"  # else an IPC stream
        try:
            if file_format:
                ipc: Any = pa.ipc.open_file(source)
                batches = [ipc.get_batch(i) for i in range(ipc.num_record_batches)]
            else:
                ipc = pa.ipc.open_stream(source)
                batches = list(ipc)
            schema = ipc.schema
            schema.names  # noqa: B018  (field names that are not UTF-8: damage)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
            problem = (
                arrow_file_problem(self.mapped.bytes, err)
                if file_format
                else f"not a readable Arrow IPC stream, or one cut short ({err})"
            )
            raise ShardFormatError(f"{path}: {problem}") from None
        col_name = pick_column(path, schema.names, col_name)
        column_type = schema.field(col_name).type
        if not (pa.types.is_list(column_type) or pa.types.is_large_list(column_type)) or not (
            pa.types.is_integer(column_type.value_type)
        ):
            raise ShardFormatError(
                f"{path}: column {col_name!r} has type {column_type}, expected a list of integer "
                "token ids (one document per record batch is file_type='arrow')"
            )
        self.dtype = np.dtype(column_type.value_type.to_pandas_dtype())
        itemsize = self.dtype.itemsize
        base = self.mapped.bytes.ctypes.data
        end = base + len(self.mapped.bytes)
        starts, lengths, self._copies = [], [], []
        views = True
        for batch in batches:
            column = batch.column(col_name)
            if column.null_count:
                raise ShardFormatError(
                    f"{path}: column {col_name!r} holds {column.null_count} null document(s)"
                )
            offsets = column.offsets.to_numpy().astype(np.int64)
            values = column.values
            if values.null_count:
                raise ShardFormatError(f"{path}: column {col_name!r} holds null token ids")
            buffer = values.buffers()[1]
            _check_offsets(path, col_name, len(starts), offsets, values, buffer, itemsize)
            _check_layout(path, col_name, len(starts), column.buffers())
            address = base if buffer is None else buffer.address + values.offset * itemsize
            inside = base <= address <= end and (address - base) % itemsize == 0
            views = views and inside
            first = (address - base) // itemsize if inside else 0
            starts.append(first + offsets[:-1])
            lengths.append(np.diff(offsets))
            self._copies.append((offsets, values))
        self.starts = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        self.n = len(self.lengths)
        self.flat = self.mapped.view(self.dtype) if views else None
        # Compressed or foreign buffers: keep per-batch values and where each batch starts.
        self._batch_of = np.repeat(np.arange(len(batches)), [len(b) for b in batches])
        self._row_in_batch = (
            np.concatenate([np.arange(len(b)) for b in batches])
            if batches
            else np.zeros(0, np.int64)
        )

    def doc(self, i: int) -> np.ndarray:
        if not 0 <= i < self.n:
            raise ShardFormatError(f"{self.path}: document {i} requested, the file holds {self.n}")
        if self.flat is not None:
            start = int(self.starts[i])
            return self.flat[start : start + int(self.lengths[i])]
        offsets, values = self._copies[int(self._batch_of[i])]
        row = int(self._row_in_batch[i])
        return values.slice(offsets[row], offsets[row + 1] - offsets[row]).to_numpy(
            zero_copy_only=False
        )

    def close(self) -> None:
        self.flat = None
        self._copies = []
        self.mapped.close()


def _check_offsets(
    path: str,
    col_name: str,
    batch: int,
    offsets: np.ndarray,
    values: pa.Array,
    buffer: pa.Buffer | None,
    itemsize: int,
) -> None:
    """Refuse list offsets that do not tile the values exactly.

    pyarrow reads IPC batches with a cheap validation that trusts the offsets between the
    first and the last; a patched one would serve other bytes of the file (or negative
    lengths) as tokens. Arrow writers store zero-based offsets over exactly the values they
    write, so the offsets must start at 0, never decrease and end at the values' length.
    The check is vectorized over the offsets alone: the values are not read.
    """
    where = f"{path}: column {col_name!r}, record batch {batch}"
    if len(offsets) and offsets[0] != 0:
        raise ShardFormatError(f"{where}: first list offset is {offsets[0]}, not 0 (damaged?)")
    steps = np.diff(offsets)
    if len(steps) and steps.min() < 0:
        row = int(np.argmax(steps < 0))
        raise ShardFormatError(
            f"{where}: list offsets decrease at row {row} ({offsets[row]} -> {offsets[row + 1]})"
        )
    last = int(offsets[-1]) if len(offsets) else 0
    if last != len(values):
        raise ShardFormatError(
            f"{where}: list offsets end at {last}, the values hold {len(values)} tokens"
        )
    have = 0 if buffer is None else buffer.size // itemsize - values.offset
    if len(values) and have < len(values):
        raise ShardFormatError(
            f"{where}: values buffer holds {have} tokens, the column needs {len(values)}"
        )


def _check_layout(path: str, col_name: str, batch: int, buffers: list[pa.Buffer | None]) -> None:
    """A column's buffers (validity, offsets, values' validity, values) follow each other
    in a batch body without overlapping; damaged metadata can point one into another."""
    spans = [(b.address, b.address + b.size) for b in buffers if b is not None and b.size]
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:
            raise ShardFormatError(
                f"{path}: column {col_name!r}, record batch {batch}: buffers overlap (damaged "
                "metadata)"
            )


class HFArrowHandler(MappedReaderHandler):
    """Arrow IPC stream or file, many rows per batch, a ``list<int>`` token column.

    Args:
        col_name: The token column (``input_ids`` in most ``datasets`` caches).
    """

    name = "hf_arrow"
    extensions = (".arrow",)
    described = ("col_name",)

    def __init__(self, col_name: str = "input_ids"):
        self.col_name = col_name

    def open(self, path: str) -> _RowsReader:
        return _RowsReader(path, self.col_name)

    def doc_lengths(self, reader: _RowsReader, indices: np.ndarray) -> np.ndarray:
        return reader.lengths[indices]

    def token_buffer(self, reader: _RowsReader) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if reader.flat is None:
            return None
        return reader.flat, reader.starts, reader.lengths
