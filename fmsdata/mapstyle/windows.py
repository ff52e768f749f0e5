"""Token ranges of the stream, read in one process: the part of a map-style dataset that
holds open files and is never pickled.

A range ``[start, stop)`` of the stream is found in its files by ``searchsorted`` over the
files' cumulative offsets, then in each file by ``searchsorted`` over the cumulative
lengths of its documents (plus their EOS where one is added). Formats with a flat token
buffer (flat token files, ``.pbin``, Megatron, MDS ``ndarray``/``bytes``, CEPE ``.npy``)
are read as views of their memory map: a slice where the documents lie back to back with
their EOS, else one vectorized gather. Other formats are read document by document.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fmsdata.access import ReaderCache
from fmsdata.errors import ShardFormatError
from fmsdata.handlers.base import FileHandler
from fmsdata.mapstyle.files import StreamFiles
from fmsdata.remote.cache import FileSource

__all__ = ["StreamReader"]

OPEN_FILES = 16  # readers kept open per process (least recently used closed)


class _FileView:
    """One open file as a token stream: document offsets, and a flat buffer if any."""

    def __init__(self, handler: FileHandler, reader: Any, add_eos: bool, expect: int, path: str):
        self.handler, self.reader, self.add_eos = handler, reader, add_eos
        n = handler.num_docs(reader)
        self.lengths = np.asarray(handler.doc_lengths(reader, np.arange(n)), dtype=np.int64)
        self.cum = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.lengths + int(add_eos), out=self.cum[1:])
        if int(self.cum[-1]) != expect:
            raise ShardFormatError(
                f"{path}: holds {int(self.cum[-1])} stream tokens, the dataset was built with "
                f"{expect} (the file changed, or the counts metadata is stale: run "
                "`fmsdata index`)"
            )
        buffer = handler.token_buffer(reader)
        self.flat = self.starts = None
        self.contiguous: int | None = None  # offset of the stream in ``flat``
        if buffer is not None:
            self.flat, self.starts = buffer[0], np.asarray(buffer[1], dtype=np.int64)
            if not add_eos and n and np.array_equal(self.starts - self.starts[0], self.cum[:-1]):
                self.contiguous = int(self.starts[0])

    def read(self, a: int, b: int, eos: int, out: np.ndarray, docs: np.ndarray | None) -> None:
        """Stream tokens ``[a, b)`` of this file into ``out``; file-local document indices
        into ``docs`` when given."""
        if self.contiguous is not None:
            out[:] = self.flat[self.contiguous + a : self.contiguous + b]
            if docs is not None:
                docs[:] = np.searchsorted(self.cum, np.arange(a, b), "right") - 1
            return
        positions = np.arange(a, b, dtype=np.int64)
        doc = np.searchsorted(self.cum, positions, "right") - 1
        if docs is not None:
            docs[:] = doc
        within = positions - self.cum[doc]
        is_eos = within >= self.lengths[doc]
        if self.flat is not None:
            out[:] = eos
            real = ~is_eos
            out[real] = self.flat[self.starts[doc[real]] + within[real]]
            return
        for d in np.unique(doc):
            mask = doc == d
            idx = within[mask]
            tokens = np.asarray(self.handler.get(self.reader, int(d)))
            if not len(tokens):
                out[mask] = eos
                continue
            out[mask] = np.where(idx < len(tokens), tokens[np.minimum(idx, len(tokens) - 1)], eos)
        out[is_eos] = eos


class StreamReader:
    """Reads stream ranges in one process; made lazily, dropped when pickled."""

    def __init__(self, files: StreamFiles, handler: FileHandler, source: FileSource, eos: int):
        self.files, self.handler, self.source, self.eos = files, handler, source, eos
        self.pid = os.getpid()
        self._readers = ReaderCache(OPEN_FILES)
        self._views: dict[int, _FileView] = {}

    def _view(self, f: int) -> _FileView:
        relative = self.files.paths[f]
        reader = self._readers.get(
            f,
            self.handler,
            lambda: self.source.local(relative),
            lambda: self._closed(f),
        )
        view = self._views.get(f)
        if view is None or view.reader is not reader:
            expect = int(self.files.offsets[f + 1] - self.files.offsets[f])
            view = _FileView(self.handler, reader, bool(self.files.add_eos[f]), expect, relative)
            self._views[f] = view
        return view

    def _closed(self, f: int) -> None:
        self._views.pop(f, None)
        self.source.release(self.files.paths[f])

    def read(
        self, start: int, stop: int, dtype: np.dtype, with_docs: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens ``[start, stop)`` of the stream, and (when asked) a document number per
        token counting from 0 at ``start``."""
        out = np.empty(stop - start, dtype=dtype)
        keys = np.empty(stop - start, dtype=np.int64) if with_docs else None
        offsets = self.files.offsets
        f = int(np.searchsorted(offsets, start, "right") - 1)
        at = start
        while at < stop:
            while offsets[f + 1] <= at:  # skip files of no tokens
                f += 1
            end = min(stop, int(offsets[f + 1]))
            piece = slice(at - start, end - start)
            local = keys[piece] if keys is not None else None
            first = int(offsets[f])
            self._view(f).read(at - first, end - first, self.eos, out[piece], local)
            if local is not None:
                local += f << 40  # documents of different files differ
            at, f = end, f + 1
        if keys is None:
            return out, None
        ids = np.zeros(len(keys), dtype=np.int64)
        if len(keys) > 1:
            np.cumsum(keys[1:] != keys[:-1], out=ids[1:])
        return out, ids

    def close(self) -> None:
        self._readers.close()
        self._views.clear()
        self.source.close()
