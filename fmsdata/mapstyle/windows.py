"""Token ranges of the stream, read in one process: the part of a map-style dataset that
holds open files and is never pickled.

A range ``[start, stop)`` of the stream is found in its files by ``searchsorted`` over the
files' cumulative offsets, then in each file by ``searchsorted`` over the cumulative
lengths of its documents (plus their EOS where one is added). Formats with a flat token
buffer (flat token files, ``.pbin``, Megatron, MDS ``ndarray``/``bytes``, CEPE ``.npy``)
are read as views of their memory map: a slice where the documents lie back to back with
their EOS, else one vectorized gather. Other formats are read document by document.

Flat token files (``npy``) skip even the handler: a window is a slice of a direct memory
map of the file (its dtype and data offset are all it takes), its document ids follow the
EOS tokens in it, and nothing per document is loaded, so random access costs what a bare
``np.memmap`` read does and a process's memory does not grow with the files it touched.

A file an EOS is added to is checked for documents that already end with it the first
time a process opens it, before any of its windows is read (``files.check_stored_eos``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fmsdata.data.access import ReaderCache
from fmsdata.errors import ShardFormatError
from fmsdata.handlers.base import FileHandler
from fmsdata.handlers.flat import FlatTokensHandler
from fmsdata.handlers.mapping import MappedFile
from fmsdata.mapstyle.files import StreamFiles, check_stored_eos
from fmsdata.remote.cache import FileSource

__all__ = ["StreamReader"]

OPEN_FILES = 64  # readers kept open per process (least recently used closed)
OPEN_MAPS = 1024  # direct maps of flat files kept per process (no per-document data)


class _DirectFlat:
    """A flat token file's stream as a direct map: ``tokens`` is the stream itself."""

    def __init__(self, path: str, handler: FlatTokensHandler, count: int):
        dtype, offset = handler.stream_layout(path)
        self.mapped = MappedFile(path)
        if offset + count * dtype.itemsize > len(self.mapped.bytes):
            raise ShardFormatError(
                f"{path}: holds fewer than the {count} tokens the dataset was built with "
                "(the file changed: build the dataset again)"
            )
        self.tokens = self.mapped.view(dtype, offset=offset, count=count)

    def close(self) -> None:
        self.mapped.close()


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
            assert self.flat is not None  # a contiguous stream lies in a flat buffer
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
            assert self.starts is not None  # set with flat
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

    def __init__(
        self,
        files: StreamFiles,
        handler: FileHandler,
        source: FileSource,
        eos: int,
        flat: FlatTokensHandler | None = None,
    ):
        self.files, self.handler, self.source, self.eos = files, handler, source, eos
        self.flat = flat  # reads the files of ``files.direct`` by direct maps
        self.pid = os.getpid()
        self._readers = ReaderCache(OPEN_FILES)
        self._maps = ReaderCache(OPEN_MAPS)
        self._views: dict[int, _FileView] = {}
        self._eos_checked: set[int] = set()  # files of ``files.check_eos`` found clean

    def _local(self, f: int) -> str:
        """The local path of file ``f``, checked to be the file the dataset was built on."""
        path = self.source.local(self.files.paths[f])
        size = os.path.getsize(path)
        if size != int(self.files.sizes[f]) and int(self.files.sizes[f]):
            raise ShardFormatError(  # (the reader cache releases the file)
                f"{self.files.paths[f]}: {size} bytes, {int(self.files.sizes[f])} when the "
                "dataset was built: the file changed (build the dataset again)"
            )
        return path

    def _view(self, f: int) -> _FileView:
        reader = self._readers.get(f, self.handler, lambda: self._local(f), lambda: self._closed(f))
        if self.files.check_eos[f] and f not in self._eos_checked:
            # Here, not only when counting: counts may come from meta/ or the cache, and
            # every process (DataLoader workers too) reads its first window of a file here.
            check_stored_eos(self.handler, reader, self.files.location(f), self.eos)
            self._eos_checked.add(f)
        view = self._views.get(f)
        if view is None or view.reader is not reader:
            expect = int(self.files.offsets[f + 1] - self.files.offsets[f])
            add_eos = bool(self.files.add_eos[f])
            view = _FileView(self.handler, reader, add_eos, expect, self.files.paths[f])
            self._views[f] = view
        return view

    def _direct(self, f: int) -> _DirectFlat:
        relative = self.files.paths[f]
        count = int(self.files.offsets[f + 1] - self.files.offsets[f])
        return self._maps.get(
            f,
            _DirectOpener(self.flat, count),
            lambda: self._local(f),
            lambda: self.source.release(relative),
        )

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
        at, pieces, numbered = start, 0, False
        while at < stop:
            while offsets[f + 1] <= at:  # skip files of no tokens
                f += 1
            end = min(stop, int(offsets[f + 1]))
            piece = slice(at - start, end - start)
            local = keys[piece] if keys is not None else None
            first = int(offsets[f])
            if self.flat is not None and self.files.direct[f]:
                tokens = self._direct(f).tokens[at - first : end - first]
                out[piece] = tokens
                if local is not None and len(local):  # documents end at their EOS
                    local[0] = 0
                    np.cumsum(tokens[:-1] == self.eos, out=local[1:])
                numbered = True  # already 0, 1, 2, ... within the piece
            else:
                self._view(f).read(at - first, end - first, self.eos, out[piece], local)
                numbered = False
            if local is not None:
                local += f << 40  # documents of different files differ
            at, f, pieces = end, f + 1, pieces + 1
        if keys is None:
            return out, None
        if pieces == 1 and numbered:
            return out, keys - keys[0]
        ids = np.zeros(len(keys), dtype=np.int64)
        if len(keys) > 1:
            np.cumsum(keys[1:] != keys[:-1], out=ids[1:])
        return out, ids

    def close(self) -> None:
        self._readers.close()
        self._maps.close()
        self._views.clear()
        self.source.close()


class _DirectOpener(FileHandler):
    """Opens ``_DirectFlat`` maps through a ``ReaderCache`` (which opens with a handler)."""

    def __init__(self, flat: FlatTokensHandler, count: int):
        self.flat, self.count = flat, count

    def open(self, path: str) -> _DirectFlat:
        return _DirectFlat(path, self.flat, self.count)

    def num_docs(self, reader: Any) -> int:
        raise NotImplementedError

    def get(self, reader: Any, index: int) -> np.ndarray:
        raise NotImplementedError
