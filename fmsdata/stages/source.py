"""What the packer reads: a document source, and the documents it hands over.

A *document source* is a stage that gives documents, not lines: ``read_ahead()`` returns
the next block of documents after its read-ahead cursor (``Documents``, never empty),
``commit(n)`` marks the first ``n`` documents read ahead and not yet committed as used,
and ``rewind()`` drops the rest of the read-ahead, so the next ``read_ahead`` starts at
the first document not committed. Its ``state_dict()`` describes committed documents
only, so a consumer commits what it used before the state is taken (the packer does, in
its ``own_state``), and the read-ahead costs nothing to save.

Two kinds are built in: one dataset's documents in one logical shard
(``fmsdata.stages.documents.DocumentStream``: a seeded random walk, or stored order, and
any order a subclass defines), and the token-share mixer over one such stream per dataset
(``fmsdata.stages.mixing.TokenShareMixer``). The packer takes either, or a user's own.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fmsdata.stages.base import Stage

__all__ = ["Documents", "DocumentSource"]

_FIELDS = ("ds", "file", "doc", "dlen", "base", "gpos")


@dataclasses.dataclass
class Documents:
    """A block of read-ahead documents, in the order they are used.

    Attributes:
        ds: Dataset index (into the chain's dataset names) of each document.
        file: File index within its dataset.
        doc: Document index within its file.
        dlen: Decorated length (BOS + kept tokens + EOS).
        base: First kept token in the file's flat token buffer, -1 if the format has none.
        gpos: Position in its dataset stream's walk, counted from the stream's start.
    """

    ds: np.ndarray
    file: np.ndarray
    doc: np.ndarray
    dlen: np.ndarray
    base: np.ndarray
    gpos: np.ndarray

    def __len__(self) -> int:
        return len(self.doc)

    def take(self, start: int, stop: int | None = None) -> Documents:
        return Documents(*(getattr(self, f)[start:stop] for f in _FIELDS))

    def select(self, index: np.ndarray) -> Documents:
        return Documents(*(getattr(self, f)[index] for f in _FIELDS))

    def then(self, other: Documents) -> Documents:
        """These documents followed by ``other``."""
        if not len(self):
            return other
        return Documents.concat([self, other])

    @staticmethod
    def concat(blocks: list[Documents]) -> Documents:
        if len(blocks) == 1:
            return blocks[0]
        return Documents(*(np.concatenate([getattr(b, f) for b in blocks]) for f in _FIELDS))

    @staticmethod
    def empty() -> Documents:
        e = np.zeros(0, dtype=np.int64)
        return Documents(e, e, e, e, e, e)


class DocumentSource(Stage):
    """A stage that gives documents in blocks, read ahead and committed as used (see the
    module docstring). Subclasses write ``read_ahead``, ``commit`` and ``rewind``, and the
    state protocol of ``Stage``; ``prefetch_upcoming`` is optional."""

    def __next__(self) -> Documents:
        raise TypeError(
            f"{type(self).__name__} is a document source: read it with read_ahead() and "
            "commit(), or put a packer on it"
        )

    def read_ahead(self) -> Documents:
        """The next documents after the read-ahead cursor (never empty)."""
        raise NotImplementedError

    def commit(self, rows: int) -> None:
        """Mark the next ``rows`` read-ahead documents (in the order given) as used."""
        raise NotImplementedError

    def rewind(self) -> None:
        """Drop the read-ahead: the next ``read_ahead`` starts at the first document not
        committed."""
        raise NotImplementedError

    def prefetch_upcoming(self) -> None:
        """Let a remote root start downloading the first file the next read opens (default:
        ask each input that is a document source)."""
        for child in self.children().values():
            prefetch = getattr(child, "prefetch_upcoming", None)
            if callable(prefetch):
                prefetch()
