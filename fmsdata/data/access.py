"""Per-worker access to shard files: local paths, open readers, document counts.

Remote files are pinned in the local cache while their reader is open.

Created lazily inside each DataLoader worker (never pickled with the dataset). Readers are
kept in one least-recently-used cache shared by every stream of the worker, so a stream's
current file and the files its buffered lines point into stay open, and the number of
open files stays bounded.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np

from fmsdata.config import Decoration
from fmsdata.data import filecounts
from fmsdata.data.catalog import Catalog, DatasetFiles
from fmsdata.data.delimiters import check_stored_delimiters
from fmsdata.errors import ShardFormatError
from fmsdata.handlers.base import FileHandler
from fmsdata.handlers.mapping import MappedFile, recording
from fmsdata.remote.cache import FileSource

__all__ = ["ReaderCache", "DatasetAccess", "count_mismatch", "make_accesses"]

# Kept tokens of a dataset measured in this process, by (root, dataset, its files, decoration):
# every shard of every chain built in the process asks the same question.
_KEPT: dict[tuple[str, str, str, Decoration], int] = {}
_KEPT_LOCK = threading.Lock()
# Which files of a dataset hold a kept document, found once per process, by the same key.
_LIVE: dict[tuple[str, str, str, Decoration], np.ndarray] = {}
# Other answers about a dataset's files (``DatasetAccess.remembered``).
_REMEMBERED: dict[tuple[tuple[str, str, str], Hashable], Any] = {}
T = TypeVar("T")
# Documents measured at a time when a file is searched for a kept one: the first block is
# small (the first document almost always passes), later ones large (vectorized).
_FIRST_PROBE = 16
_MAX_PROBE = 1 << 16


class ReaderCache:
    """Open readers by key, closing the least recently used beyond ``capacity``.

    Args:
        capacity: Readers kept open at most.
        over_limit: Whether the files behind the readers take more room than allowed (a
            remote cache beyond ``remote_cache_gb``, where an open reader pins its file):
            then readers are closed, least recently used first, down to ``floor``, so
            their files can be evicted.
        floor: Readers kept open however full the cache (each stream's current file).
    """

    def __init__(self, capacity: int, over_limit: Callable[[], bool] | None = None, floor: int = 1):
        self.capacity = max(1, capacity)
        self.over_limit = over_limit
        self.floor = max(1, floor)
        self._open: collections.OrderedDict[
            Any, tuple[FileHandler, Any, Callable[[], None] | None]
        ] = collections.OrderedDict()
        # The files each reader mapped (checked at every access: see MappedFile).
        self._mapped: dict[Any, list[MappedFile]] = {}

    def get(
        self,
        key: Any,
        handler: FileHandler,
        path: Callable[[], str],
        on_close: Callable[[], None] | None = None,
    ) -> Any:
        """The reader for ``key``, opening ``path()`` with ``handler`` if needed;
        ``on_close`` runs when the reader is closed."""
        entry = self._open.get(key)
        if entry is not None:
            self._open.move_to_end(key)
            for mapped in self._mapped[key]:
                mapped.check_unchanged()  # a cut mapped file would kill the process (SIGBUS)
            return entry[1]
        try:
            with recording() as mapped:  # this open's mappings, the others not looked at
                reader = handler.open(path())
        except BaseException:
            if on_close is not None:
                on_close()
            raise
        self._open[key] = (handler, reader, on_close)
        self._mapped[key] = mapped
        while len(self._open) > self.capacity or (
            self.over_limit is not None and len(self._open) > self.floor and self.over_limit()
        ):
            old_key, old = self._open.popitem(last=False)
            del self._mapped[old_key]
            self._close(*old)
        return reader

    @staticmethod
    def _close(handler: FileHandler, reader: Any, on_close: Callable[[], None] | None) -> None:
        try:
            handler.close(reader)
        finally:
            if on_close is not None:
                on_close()

    def release(self) -> None:
        """Let every open reader give back what it can get again (mapped pages)."""
        for handler, reader, _ in self._open.values():
            handler.release(reader)

    def close(self) -> None:
        while self._open:
            _, entry = self._open.popitem()
            self._close(*entry)
        self._mapped.clear()


class DatasetAccess:
    """One dataset's files as the streams and the line writer of a worker see them.

    Args:
        index: Position of the dataset in the config (the ``ds`` field of spans).
        files: The dataset's file list and known counts.
        handler: Format handler.
        source: Local paths of the root's files (pulled into the cache if remote).
        readers: The worker's shared reader cache.
        root: The data root (the key of counts shared in the process, ``filecounts``).
    """

    def __init__(
        self,
        index: int,
        files: DatasetFiles,
        handler: FileHandler,
        source: FileSource,
        readers: ReaderCache,
        root: str = "",
    ):
        self.index = index
        self.files = files
        self.name = files.name
        self.handler = handler
        self.root = root
        self._source = source
        self._readers = readers
        self._counts = files.docs.copy()
        self._delimiters_checked: set[tuple[int, Decoration]] = set()
        self._digest: str | None = None

    @property
    def num_files(self) -> int:
        return len(self.files.paths)

    def path(self, file: int) -> str:
        return self.files.paths[file]

    def reader(self, file: int) -> Any:
        relative = self.files.paths[file]
        return self._readers.get(
            (self.index, file),
            self.handler,
            lambda: self._source.local(relative),
            lambda: self._source.release(relative),
        )

    def prefetch(self, file: int) -> None:
        """Hint that ``file`` is read soon (a remote root starts downloading it)."""
        self._source.prefetch(self.files.paths[file])

    def doc_count(self, file: int) -> int:
        """Documents in a file: known from the catalog or counted before in this process,
        else by opening it (once per process: ``filecounts``)."""
        n = int(self._counts[file])
        if n < 0:
            relative, size = self.files.paths[file], int(self.files.sizes[file])
            seen = filecounts.recall(self.root, relative, size)
            if seen is None:
                n = self.handler.num_docs(self.reader(file))
                filecounts.remember(self.root, relative, size, n)
            else:
                n = seen[0]
            self._counts[file] = n
        return n

    def holds_fewer_tokens(self, decoration: Decoration, budget: int) -> bool:
        """Whether the packer sees fewer than ``budget`` tokens from the whole dataset
        (decorated documents that are kept): it decides whether a small dataset rotates.

        Decided from the per-file counts where they settle it, without opening a file:
        a kept document gives its tokens, less at most the stripped ones, plus the
        decoration's; a skipped one held fewer than ``min_length`` tokens after
        stripping. Otherwise measured exactly, once per process (``_KEPT``).
        """
        docs, tokens = self.files.docs, self.files.tokens
        if len(docs) and (docs >= 0).all() and (tokens >= 0).all():
            n_docs, n_tokens = int(docs.sum()), int(tokens.sum())
            stripped = 2 if decoration.strip else 0
            least = n_tokens - n_docs * (stripped + max(1, decoration.min_length) - 1)
            most = n_tokens + decoration.extra * n_docs
            if least >= budget:
                return False
            if most < budget:
                return True
        return self._kept_tokens(decoration) < budget

    def live_files(self, decoration: Decoration) -> np.ndarray:
        """Whether each file holds a document that ``decoration`` keeps (boolean per file):
        the files the document deal is computed over (``fmsdata.stages.deal``).

        Settled from the counts where they can: a file without documents holds none; one
        whose tokens outnumber what its documents could hold were every one of them
        skipped (``Decoration.longest_skipped`` each) holds one. Other files are searched,
        a block of documents at a time, up to their first kept document (usually their
        first). Found once per process (``_LIVE``); needs every file's document count.
        """
        key = self._key(decoration)
        with _KEPT_LOCK:
            known = _LIVE.get(key)
        if known is not None:
            return known.copy()
        counts = self._known_counts()
        tokens = self._token_counts(counts)
        longest = decoration.longest_skipped
        has = (counts >= 0) & (tokens >= 0)
        live = has & (counts > 0) & (tokens > counts * longest)
        settled = live | (counts == 0) | (has & (tokens == 0))
        open_now = np.flatnonzero(~settled).tolist()
        if open_now and getattr(self._source, "downloads", False):
            live[open_now] = self._first_documents_kept(open_now, decoration)
            open_now = [f for f in open_now if not live[f]]
        for f in open_now:
            if counts[f] > 0:  # a remote root downloads them side by side
                self.prefetch(f)
        for f in open_now:  # (counted and searched while the reader is open)
            n = self.doc_count(f)
            live[f] = n > 0 and self._holds_kept(f, n, decoration)
        with _KEPT_LOCK:
            _LIVE[key] = live
        return live.copy()

    def _first_documents_kept(self, files: list[int], decoration: Decoration) -> np.ndarray:
        """Whether a remote file's first documents show a kept one, read from its format's
        metadata with range requests (``fmsdata.data.metacount.first_lengths``), so that a
        root without token counts is not downloaded to be searched."""
        from fmsdata.data.metacount import first_lengths  # (imports the handlers' readers)

        source = self._source
        found = first_lengths(
            source.root,  # type: ignore[attr-defined]
            source.storage,  # type: ignore[attr-defined]
            [self.files.paths[f] for f in files],
            [int(self.files.sizes[f]) for f in files],
            self.handler,
        )
        longest = decoration.longest_skipped
        return np.array(
            [lengths is not None and bool((lengths > longest).any()) for lengths in found]
        )

    def _known_counts(self) -> np.ndarray:
        """Documents of each file where known without opening it, else -1."""
        counts = self._counts.copy()
        for f in np.flatnonzero(counts < 0).tolist():
            seen = filecounts.recall(self.root, self.files.paths[f], int(self.files.sizes[f]))
            if seen is not None:
                counts[f] = self._counts[f] = seen[0]
        return counts

    def _token_counts(self, counts: np.ndarray) -> np.ndarray:
        """Tokens of each file where known (counts metadata, format metadata, or counted
        before in this process), else -1."""
        tokens = self.files.tokens.copy()
        for f in np.flatnonzero(tokens < 0).tolist():
            seen = filecounts.recall(self.root, self.files.paths[f], int(self.files.sizes[f]))
            if seen is not None and seen[0] == counts[f]:
                tokens[f] = seen[1]
        return tokens

    def _holds_kept(self, file: int, n_docs: int, decoration: Decoration) -> bool:
        """Whether the file holds a document the decoration keeps, searched a block of
        documents at a time (its stored delimiters are checked when it is read)."""
        reader = self.reader(file)
        found = self.handler.num_docs(reader)
        if found != n_docs:
            raise ShardFormatError(count_mismatch(self.files.paths[file], found, n_docs))
        least = max(1, decoration.min_length)
        at, block = 0, _FIRST_PROBE
        while at < n_docs:
            docs = np.arange(at, min(n_docs, at + block), dtype=np.int64)
            lengths = np.asarray(self.handler.doc_lengths(reader, docs), dtype=np.int64)
            if decoration.strip:
                first, last = self.handler.doc_edges(reader, docs)
                lead, trail = decoration.strip_amounts(lengths, first, last)
                lengths = lengths - lead - trail
            if bool((lengths >= least).any()):
                return True
            at += len(docs)
            block = min(block * 16, _MAX_PROBE)
        return False

    def remembered(self, question: Hashable, answer: Callable[[], T]) -> T:
        """``answer()`` to ``question`` about this dataset's files, found once per process:
        every shard of every chain built in the process asks the same (an answer that
        raises is not kept)."""
        key = (self._files_key(), question)
        with _KEPT_LOCK:
            if key in _REMEMBERED:
                return _REMEMBERED[key]  # type: ignore[no-any-return]
        found = answer()
        with _KEPT_LOCK:
            _REMEMBERED[key] = found
        return found

    def _key(self, decoration: Decoration) -> tuple[str, str, str, Decoration]:
        return (*self._files_key(), decoration)

    def _files_key(self) -> tuple[str, str, str]:
        """What a per-process answer about this dataset's files is kept under: the root,
        the dataset and a digest of its file list and sizes."""
        if self._digest is None:
            digest = hashlib.blake2b(digest_size=12)
            for path, size in zip(self.files.paths, self.files.sizes.tolist()):
                digest.update(f"{path}\0{size}\0".encode())
            self._digest = digest.hexdigest()
        return (self.root, self.name, self._digest)

    def _kept_tokens(self, decoration: Decoration) -> int:
        key = self._key(decoration)
        with _KEPT_LOCK:
            known = _KEPT.get(key)
        if known is not None:
            return known
        total = 0
        for f in range(self.num_files):  # a remote root downloads them side by side
            self.prefetch(f)
        for f in range(self.num_files):
            docs = np.arange(self.doc_count(f))
            lengths, lead, trail, _ = self.measure(f, docs, decoration)
            content = lengths - lead - trail
            kept = content >= max(1, decoration.min_length)
            total += int(content[kept].sum()) + decoration.extra * int(kept.sum())
        with _KEPT_LOCK:
            _KEPT[key] = total
        return total

    def measure(
        self, file: int, docs: np.ndarray, decoration: Decoration
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Raw length, tokens stripped at start and at end, and start in the file's flat
        token buffer (None when the format has none) of the given documents."""
        reader = self.reader(file)
        n = self.handler.num_docs(reader)
        if n != self.doc_count(file):
            raise ShardFormatError(count_mismatch(self.files.paths[file], n, self.doc_count(file)))
        if (file, decoration) not in self._delimiters_checked:
            relative = self.files.paths[file]
            path = f"{self.root.rstrip('/')}/{relative}" if self.root else relative
            d = decoration
            check_stored_delimiters(self.handler, reader, path, d.bos, d.eos, d.strip)
            self._delimiters_checked.add((file, decoration))
        lengths = np.asarray(self.handler.doc_lengths(reader, docs), dtype=np.int64)
        buffer = self.handler.token_buffer(reader)
        starts = buffer[1][docs] if buffer is not None else None
        if decoration.strip:
            first, last = self.handler.doc_edges(reader, docs)
            lead, trail = decoration.strip_amounts(lengths, first, last)
        else:
            lead = trail = np.zeros(len(docs), dtype=np.int64)
        return lengths, lead, trail, starts


def count_mismatch(path: str, found: int, recorded: int) -> str:
    """What is wrong with a file whose documents differ from its counts metadata. Fewer
    than recorded means the file lost documents (cut short, or damaged and read leniently):
    indexing it again would record the damage as the truth, so the advice is to restore it."""
    said = f"{path}: holds {found:,} documents but the counts metadata (meta/) records {recorded:,}"
    if found < recorded:
        return (
            f"{said}: it lost {recorded - found:,} since it was indexed (cut short or damaged); "
            "restore it from its source, and re-index only if it was replaced on purpose"
        )
    return (
        f"{said}: it changed since it was indexed; if the new file is meant, run `fmsdata index` "
        "on the root to record it"
    )


def make_accesses(
    catalog: Catalog, handler: FileHandler, source: FileSource, readers: ReaderCache
) -> list[DatasetAccess]:
    return [
        DatasetAccess(i, files, handler, source, readers, catalog.root)
        for i, files in enumerate(catalog.datasets)
    ]
