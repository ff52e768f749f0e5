"""The contract every shard-format handler follows.

A handler turns one shard file into random access over its documents. The pipeline never
reads tokens through anything else, so a new format is one subclass: ``open``,
``num_docs`` and ``get`` are required, the rest have correct (if slower) defaults that a
format overrides when it can answer from metadata or vectorize.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from fmsdata.errors import ShardFormatError

__all__ = [
    "FileHandler",
    "FlatBuffer",
    "FlatBufferHandler",
    "MappedReaderHandler",
    "column_candidates",
    "pick_column",
]


def column_candidates(col_name: str) -> tuple[str, ...]:
    """The column names a ``col_name`` option allows: one name, or a comma list of them
    (``"text,contents,tokens"``), tried in order in each file."""
    return tuple(name for name in (part.strip() for part in col_name.split(",")) if name)


def pick_column(path: str, columns: Sequence[str], col_name: str) -> str:
    """The first of ``col_name``'s candidates that the file at ``path`` has.

    Resolved per file, so the datasets of one root may name their column differently.

    Raises:
        ShardFormatError: The file has none of them (naming the file, the candidates and
            the columns it has).
    """
    candidates = column_candidates(col_name)
    for name in candidates:
        if name in columns:
            return name
    wanted = repr(candidates[0]) if len(candidates) == 1 else f"among {list(candidates)}"
    raise ShardFormatError(
        f"{path}: no token column {wanted}; columns are {list(columns)} "
        "(set col_name to the column holding token ids)"
    )


class FileHandler(ABC):
    """Random access to the documents of one shard format.

    Subclasses set ``name`` (the ``file_type`` users select) and ``extensions`` (the file
    endings the handler claims), and may take keyword options in ``__init__`` (e.g. the
    token column). A handler object must be small and picklable: it is sent to every
    DataLoader worker. Readers it returns stay in the worker that opened them.
    """

    name: ClassVar[str] = ""
    extensions: ClassVar[tuple[str, ...]] = ()
    # Whether the format itself ends every stored document with its end-of-document token
    # (flat streams split on it, Modalities .pbin): a loader adding its own EOS then
    # replaces that one instead of doubling it (see fmsdata.data.rootconfig).
    documents_end_with_eos: ClassVar[bool] = False
    # The attributes (options) that decide what the handler reads: ``describe`` names them.
    described: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def is_legal(cls, path: str) -> bool:
        """Whether ``path`` is a shard of this format (by its ending)."""
        return path.endswith(cls.extensions)

    @classmethod
    def select(cls, paths: list[str]) -> list[str]:
        """The shards among a dataset folder's files (default: those ``is_legal`` accepts).

        Formats whose shards span several files name one of them here (see
        ``companions``).
        """
        return [path for path in paths if cls.is_legal(path)]

    @classmethod
    def companions(cls, path: str) -> list[str]:
        """Other files a shard needs beside ``path`` (fetched with it from remote roots)."""
        return []

    @abstractmethod
    def open(self, path: str) -> Any:
        """Open a local shard file and return a reader for it.

        Raises:
            ShardFormatError: The file is not a valid shard of this format.
        """

    @abstractmethod
    def num_docs(self, reader: Any) -> int:
        """Number of documents in an open shard."""

    @abstractmethod
    def get(self, reader: Any, index: int) -> np.ndarray:
        """Document ``index`` as a 1-D integer array, a zero-copy view where the format allows."""

    def slice(self, doc: np.ndarray, start: int, n: int) -> np.ndarray:
        """Tokens ``[start, start + n)`` of a document returned by ``get``."""
        return doc[start : start + n]

    def doc_lengths(self, reader: Any, indices: np.ndarray) -> np.ndarray:
        """Token counts of the given documents (int64 array)."""
        return np.fromiter(
            (len(self.get(reader, int(i))) for i in indices), dtype=np.int64, count=len(indices)
        )

    def doc_edges(self, reader: Any, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First and last token of each given document (-1 for an empty document)."""
        first = np.full(len(indices), -1, dtype=np.int64)
        last = np.full(len(indices), -1, dtype=np.int64)
        lengths = np.asarray(self.doc_lengths(reader, indices), dtype=np.int64)
        buffer = self.token_buffer(reader)
        if buffer is not None:
            flat, starts = buffer[0], buffer[1][indices]
            nonempty = lengths > 0
            first[nonempty] = flat[starts[nonempty]]
            last[nonempty] = flat[starts[nonempty] + lengths[nonempty] - 1]
            return first, last
        for k, i in enumerate(indices):
            doc = self.get(reader, int(i))
            if len(doc):
                first[k] = int(doc[0])
                last[k] = int(doc[-1])
        return first, last

    def reader_format(self, reader: Any) -> type[FileHandler]:
        """The format that reads an open file (``auto`` answers the one it picked)."""
        return type(self)

    def token_buffer(self, reader: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(flat, starts, lengths)`` when every document is ``flat[start : start + length]``.

        Formats that store documents back to back (memory maps) return their whole token
        array once, so lines are copied from it without a call per document. Default: None.
        """
        return None

    def damage(self, reader: Any) -> str | None:
        """What a lenient read of this open file left out, and why (a compressed stream
        cut short loses its documents after the cut), or None. Errors about a dataset
        with too few documents name it, since the cause is otherwise only in a log line."""
        return None

    def count(self, path: str) -> tuple[int, int]:
        """(documents, tokens) of a shard, for the counts metadata."""
        reader = self.open(path)
        try:
            n = self.num_docs(reader)
            tokens = int(self.doc_lengths(reader, np.arange(n, dtype=np.int64)).sum())
            return n, tokens
        finally:
            self.close(reader)

    def count_metadata(
        self, read: Callable[[str, int, int], bytes], path: str, size: int, tokens: bool
    ) -> tuple[int, int] | None:
        """The documents and tokens of ``path`` (``size`` bytes) from the small parts of it
        where its format keeps them, read with ``read(path, start, end) -> bytes`` (a range
        request on object storage; ``end`` -1: to the end): how a remote root is counted
        without downloading every file (``fmsdata.data.metacount``). Tokens -1 where the
        metadata does not say (only asked for with ``tokens``). None (the default): the
        format keeps no such metadata, and the file is counted where it is opened."""
        return None

    def release(self, reader: Any) -> None:
        """Give back memory the reader holds that it can get again (e.g. mapped pages).

        Called when the worker's resident memory grows past its budget. Default: nothing.
        """
        return None

    def close(self, reader: Any) -> None:
        """Release a reader (default: call its ``close`` when it has one)."""
        closer = getattr(reader, "close", None)
        if callable(closer):
            closer()

    def describe(self) -> dict[str, Any]:
        """The options that decide what this handler reads, for state fingerprints."""
        return {"file_type": self.name, **{name: getattr(self, name) for name in self.described}}


class MappedReaderHandler(FileHandler):
    """A handler whose readers hold ``n`` documents, return document ``i`` from ``doc(i)``
    and map their file as ``mapped`` (a ``MappedFile``, released under memory pressure)."""

    def num_docs(self, reader: Any) -> int:
        return reader.n

    def get(self, reader: Any, index: int) -> np.ndarray:
        return reader.doc(index)

    def release(self, reader: Any) -> None:
        reader.mapped.release()


class FlatBuffer:
    """An open shard whose documents are ranges of one flat token array.

    Document ``i`` is ``flat[starts[i] : starts[i] + lengths[i]]``. Formats that store
    tokens back to back (memory maps of ``.npy``/``.bin``/``.pbin``/Megatron files, token
    caches) build one of these in ``open`` and let ``FlatBufferHandler`` answer the rest.

    Args:
        path: The shard, for error messages.
        flat: All tokens of the shard (usually a view of a memory map).
        starts: Each document's first token in ``flat``.
        lengths: Each document's token count.
        maps: The ``MappedFile``s behind ``flat`` (released and closed with the reader).
    """

    def __init__(
        self,
        path: str,
        flat: np.ndarray,
        starts: np.ndarray,
        lengths: np.ndarray,
        maps: Sequence[Any] = (),
    ):
        self.path = path
        self.flat = flat
        self.starts = np.asarray(starts, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.maps = [m for m in maps if m is not None]

    @property
    def n(self) -> int:
        """Documents in the shard."""
        return len(self.lengths)

    def document(self, index: int) -> np.ndarray:
        """Tokens of document ``index`` (a view), or ShardFormatError naming the file."""
        if not 0 <= index < len(self.lengths):
            raise ShardFormatError(
                f"{self.path}: document {index} requested, the file holds {len(self.lengths)}"
            )
        start = int(self.starts[index])
        return self.flat[start : start + int(self.lengths[index])]

    def release(self) -> None:
        for mapped in self.maps:
            mapped.release()

    def close(self) -> None:
        for mapped in self.maps:
            mapped.close()


class FlatBufferHandler(FileHandler):
    """A handler whose ``open`` returns a ``FlatBuffer``: documents are ranges of a flat
    token buffer. Subclasses write ``open`` (parse and check the file) and nothing else of
    the read path; lines are then copied straight out of the buffer."""

    @abstractmethod
    def open(self, path: str) -> FlatBuffer:
        """Open a local shard file as a ``FlatBuffer``."""

    def num_docs(self, reader: FlatBuffer) -> int:
        return reader.n

    def get(self, reader: FlatBuffer, index: int) -> np.ndarray:
        return reader.document(index)

    def doc_lengths(self, reader: FlatBuffer, indices: np.ndarray) -> np.ndarray:
        return reader.lengths[indices]

    def token_buffer(self, reader: FlatBuffer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return reader.flat, reader.starts, reader.lengths

    def release(self, reader: FlatBuffer) -> None:
        reader.release()
