"""Documents of fms-fsdp's Arrow shards (one record batch per document), edges stripped.

fms-fsdp's Arrow handler takes the first of ``col_name``'s columns a batch has, then drops
the first token if it is one of the strip tokens, then the last if it is one (so a document
that was ``[eos]`` becomes empty). Files are read by fmsdata's Arrow handler
(``fmsdata.handlers.arrow``: zero-copy views of the memory map, documents located a block
at a time from the IPC metadata) and numbered: a chain's file table, so buffered lines can
name them by id. At most ``max_open`` files stay open.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from fmsdata.errors import ShardFormatError
from fmsdata.handlers.arrow import ArrowDocHandler

__all__ = ["ArrowDocs"]

_BLOCK = 1024  # documents located per metadata gather


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
        self._handler = ArrowDocHandler(",".join(columns))
        self._open: OrderedDict[int, tuple[Any, set[int]]] = OrderedDict()  # reader, blocks

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": OrderedDict()}

    def _file(self, fid: int) -> tuple[Any, set[int]]:
        f = self._open.get(fid)
        if f is None:
            path = self.paths[fid]
            if "arrow" not in path.rsplit(".", 1)[-1]:
                raise ShardFormatError(
                    f"{path}: only Arrow shards are read in fms-fsdp order (hf_parquet is not yet)"
                )
            # dropped, not closed, when evicted: documents handed out stay views of the map
            try:
                f = self._handler.open(path), set()
            except OSError as err:
                raise ShardFormatError(f"{path}: cannot open ({err})") from None
            if len(self._open) >= self.max_open:
                self._open.popitem(last=False)
            self._open[fid] = f
        else:
            self._open.move_to_end(fid)
        return f

    def count(self, fid: int) -> int:
        return self._handler.num_docs(self._file(fid)[0])

    def get(self, fid: int, index: int) -> np.ndarray:
        """Document ``index`` of file ``fid`` as an integer array (a view), edges stripped."""
        reader, located = self._file(fid)
        if index // _BLOCK not in located:
            n, lo = self._handler.num_docs(reader), index // _BLOCK * _BLOCK
            if 0 <= index < n:
                located.add(index // _BLOCK)
                self._handler.doc_lengths(reader, np.arange(lo, min(n, lo + _BLOCK)))
        doc = self._handler.get(reader, index)
        if len(doc) and int(doc[0]) in self.strip:
            doc = doc[1:]
        if len(doc) and int(doc[-1]) in self.strip:
            doc = doc[:-1]
        return doc
