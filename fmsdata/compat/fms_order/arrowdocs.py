"""Documents of fms-fsdp's Arrow shards (one record batch per document), edges stripped.

fms-fsdp's Arrow handler takes the first of ``col_name``'s columns a batch has, then drops
the first token if it is one of the strip tokens, then the last if it is one (so a document
that was ``[eos]`` becomes empty). Here the column is a zero-copy numpy view of the memory
map; readers stay open per file (a few at a time).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyarrow as pa

from fmsdata.errors import ShardFormatError

__all__ = ["ArrowDocs"]


class ArrowDocs:
    """Reads stripped documents; holds at most ``max_open`` files open."""

    def __init__(self, columns: tuple[str, ...], strip: frozenset[int], max_open: int = 8):
        self.columns, self.strip, self.max_open = columns, strip, max_open
        self._open: OrderedDict[str, pa.RecordBatchFileReader] = OrderedDict()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": OrderedDict()}

    def reader(self, path: str) -> pa.RecordBatchFileReader:
        reader = self._open.pop(path, None)
        if reader is None:
            if "arrow" not in path.rsplit(".", 1)[-1]:
                raise ShardFormatError(
                    f"{path}: only Arrow shards are read in fms-fsdp order (hf_parquet is not yet)"
                )
            try:
                reader = pa.ipc.open_file(pa.memory_map(path))
            except (OSError, pa.ArrowInvalid) as err:
                raise ShardFormatError(f"{path}: not a readable Arrow IPC file ({err})") from None
            if len(self._open) >= self.max_open:
                self._open.popitem(last=False)
        self._open[path] = reader
        return reader

    def count(self, path: str) -> int:
        return self.reader(path).num_record_batches

    def get(self, path: str, index: int) -> np.ndarray:
        """Document ``index`` of ``path`` as an integer array, edges stripped."""
        batch = self.reader(path).get_batch(index)
        for name in self.columns:
            if name in batch.schema.names:
                column = batch.column(name)
                break
        else:
            raise ShardFormatError(
                f"{path}: record batch {index} has none of the columns {list(self.columns)} "
                f"(it has {batch.schema.names})"
            )
        doc = column.to_numpy(zero_copy_only=False)
        if len(doc) and int(doc[0]) in self.strip:
            doc = doc[1:]
        if len(doc) and int(doc[-1]) in self.strip:
            doc = doc[:-1]
        return doc
