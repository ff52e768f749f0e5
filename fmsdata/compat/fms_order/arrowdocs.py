"""Documents of fms-fsdp's Arrow shards (one record batch per document), edges stripped.

fms-fsdp's Arrow handler takes the first of ``col_name``'s columns a batch has, then drops
the first token if it is one of the strip tokens, then the last if it is one (so a document
that was ``[eos]`` becomes empty). Here files are numbered (a chain's file table, so
buffered lines can name them by id) and read as zero-copy numpy views of the memory map:
``fmsdata.handlers.arrow_index`` locates a block of documents at once from the IPC
metadata, and stripping is applied to the whole block's offsets, so a document is two
array lookups and a slice. Files whose batches are not in that simple layout (compressed,
nulls, variable-width columns before the tokens) are read through pyarrow, one batch at a
time. At most ``max_open`` files stay mapped.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyarrow as pa

from fmsdata.errors import ShardFormatError
from fmsdata.handlers.arrow_index import RecordBatchIndex

__all__ = ["ArrowDocs"]

_BLOCK = 1024  # documents located per metadata gather


class _File:
    """One mapped file: its tokens view, its batch index and the located blocks."""

    def __init__(self, path: str, columns: tuple[str, ...]):
        if "arrow" not in path.rsplit(".", 1)[-1]:
            raise ShardFormatError(
                f"{path}: only Arrow shards are read in fms-fsdp order (hf_parquet is not yet)"
            )
        try:
            self.source = pa.memory_map(path).read_buffer()
            self.reader = pa.ipc.open_file(self.source)
        except (OSError, pa.ArrowInvalid) as err:
            raise ShardFormatError(f"{path}: not a readable Arrow IPC file ({err})") from None
        self.path, self.columns = path, columns
        self.n_docs = self.reader.num_record_batches
        names = self.reader.schema.names
        self.column = next((names.index(c) for c in columns if c in names), None)
        self.tokens: np.ndarray | None = None
        self.index: RecordBatchIndex | None = None
        if self.column is not None:
            dtype = self.reader.schema.types[self.column]
            if pa.types.is_integer(dtype):
                buf = np.frombuffer(self.source, dtype=np.uint8)
                self.index = RecordBatchIndex.read(buf)
                self.buf = buf
                self.np_dtype = np.dtype(dtype.to_pandas_dtype())
                usable = len(buf) // self.np_dtype.itemsize * self.np_dtype.itemsize
                self.tokens = buf[:usable].view(self.np_dtype)
        self.blocks: dict[int, tuple[np.ndarray, np.ndarray] | None] = {}


class ArrowDocs:
    """Reads stripped documents of the files in ``paths`` (ids are positions there)."""

    def __init__(
        self,
        paths: list[str],
        columns: tuple[str, ...],
        strip: frozenset[int],
        max_open: int = 64,
    ):
        self.paths, self.columns, self.strip, self.max_open = paths, columns, strip, max_open
        self._strip = np.array(sorted(strip), dtype=np.int64)
        self._open: OrderedDict[int, _File] = OrderedDict()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": OrderedDict()}

    def _file(self, fid: int) -> _File:
        f = self._open.get(fid)
        if f is None:
            f = _File(self.paths[fid], self.columns)
            if len(self._open) >= self.max_open:
                self._open.popitem(last=False)
            self._open[fid] = f
        else:
            self._open.move_to_end(fid)
        return f

    def count(self, fid: int) -> int:
        return self._file(fid).n_docs

    def get(self, fid: int, index: int) -> np.ndarray:
        """Document ``index`` of file ``fid`` as an integer array (a view), edges stripped."""
        f = self._file(fid)
        block = index // _BLOCK
        if block not in f.blocks:
            f.blocks[block] = self._locate(f, block)
        located = f.blocks[block]
        if located is None:
            return self._get_slow(f, index)
        starts, ends = located
        k = index - block * _BLOCK
        assert f.tokens is not None
        return f.tokens[starts[k] : ends[k]]

    def _locate(self, f: _File, block: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Stripped ``[start, end)`` token offsets of one block of documents, or None
        where the fast layout does not apply."""
        if f.index is None or f.tokens is None or f.column is None:
            return None
        lo, hi = block * _BLOCK, min((block + 1) * _BLOCK, f.n_docs)
        found = f.index.locate(f.buf, np.arange(lo, hi), f.column, f.np_dtype.itemsize)
        if found is None:
            return None
        starts, lengths = found
        ends = starts + lengths
        tokens = f.tokens
        head = np.zeros(len(starts), dtype=bool)
        nonempty = lengths > 0
        head[nonempty] = np.isin(tokens[starts[nonempty]], self._strip)
        starts = starts + head
        tail = np.zeros(len(starts), dtype=bool)
        nonempty = ends > starts
        tail[nonempty] = np.isin(tokens[ends[nonempty] - 1], self._strip)
        return starts, ends - tail

    def _get_slow(self, f: _File, index: int) -> np.ndarray:
        batch = f.reader.get_batch(index)
        for name in self.columns:
            if name in batch.schema.names:
                column = batch.column(name)
                break
        else:
            raise ShardFormatError(
                f"{f.path}: record batch {index} has none of the columns {list(self.columns)} "
                f"(it has {batch.schema.names})"
            )
        doc = column.to_numpy(zero_copy_only=False)
        if len(doc) and int(doc[0]) in self.strip:
            doc = doc[1:]
        if len(doc) and int(doc[-1]) in self.strip:
            doc = doc[:-1]
        return doc
