"""A line as the trace follows it through token-level stages: parts, not tokens.

``fmsdata trace`` (``fmsdata.trace``) replays each logical shard's chain at span level
(the stages themselves run; no token is read) and follows what each token-level stage
does to a line by asking the stage: ``TokenStage.trace(line)`` gets the line as a
``TracedLine`` and does to its *parts* what ``apply`` does to its tokens. A part is a run
of the line's tokens with a known origin: ``length`` tokens of one stored document from
token ``start`` on, or tokens the loader inserted (BOS/EOS, BOL/EOL, padding, FIM
sentinels), so the trace can say where every token of a delivered row came from.

The parts of a line are grouped as ``TokenLine`` groups its tokens: one *piece* per span
(its BOS, document tokens and EOS; the line's BOL joins the first piece, its EOL the
last), each with its document id, then the *tail*: what the row holds after its content
(padding). A stage that only decides from the parts' origins and its keyed randomness
reads nothing; one whose decision looks at token values (a ``DocumentFilter``'s
``keep``, FIM's delimiter check at a piece's edges) asks ``line.tokens`` or
``line.edges`` for exactly the tokens it looks at.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["Part", "TracedLine", "NotTraceable", "cut_parts", "parts_length", "DOC"]

DOC = "doc"  # the kind of a part holding a document's stored tokens


class NotTraceable(Exception):
    """Raised by a ``TokenStage.trace`` that cannot follow a line (the default): the trace
    names the stage and says the rows are followed only up to it."""


@dataclasses.dataclass(frozen=True)
class Part:
    """A run of ``length`` tokens of a line.

    Attributes:
        kind: ``"doc"`` for stored document tokens; else what the loader inserted:
            ``"bos"``, ``"eos"``, ``"bol"``, ``"eol"``, ``"pad"``, ``"fim_pre"``,
            ``"fim_mid"``, ``"fim_suf"`` (a stage of yours may name its own).
        length: Tokens in the run.
        token: An inserted part's token id (every token of the run), -1 for ``"doc"``.
        dataset, file, doc: A document part's dataset index (the ``ds`` of spans), file
            index in the dataset's sorted file list and document index in the file.
        start: A document part's first token, counted in the stored document (a token
            ``strip_tokens`` removed counts: ``start`` indexes what the handler returns).
        role: What a stage made of the part, for the reader (FIM: ``"prefix"``,
            ``"middle"``, ``"suffix"``); empty when none.
    """

    kind: str
    length: int
    token: int = -1
    dataset: int = -1
    file: int = -1
    doc: int = -1
    start: int = -1
    role: str = ""

    @property
    def is_doc(self) -> bool:
        return self.kind == DOC

    def cut(self, begin: int, end: int) -> Part:
        """Tokens ``[begin, end)`` of this part."""
        start = self.start + begin if self.is_doc else self.start
        return dataclasses.replace(self, length=end - begin, start=start)


def parts_length(parts: Sequence[Part]) -> int:
    return sum(part.length for part in parts)


def cut_parts(parts: Sequence[Part], begin: int, end: int) -> list[Part]:
    """The parts covering tokens ``[begin, end)`` of ``parts`` laid end to end."""
    out: list[Part] = []
    at = 0
    for part in parts:
        lo, hi = max(begin, at), min(end, at + part.length)
        if lo < hi:
            out.append(part.cut(lo - at, hi - at))
        at += part.length
        if at >= end:
            break
    return out


# Reads ``length`` stored tokens of a document from ``start``: (dataset, file, doc, start,
# length) -> int array. Given by the trace, which knows the data.
Reader = Callable[[int, int, int, int, int], np.ndarray]


class TracedLine:
    """One line of a logical shard as ``TokenStage.trace`` sees it.

    Attributes:
        pieces: The parts of each document piece of the line's content, in order (as
            ``TokenLine.pieces`` counts them: the line's BOL joins the first, its EOL the
            last). A stage sets them anew with ``set_content``.
        ids: The document id of each piece (``fmsdata.stages.outputs``).
        tail: What the row holds after its content (padding), as parts.
        spans: The line's spans (read only).
        ahead: Lines its shard emitted between the stage's state and this line: a stage
            keyed by its count of lines seen (FIM) draws with ``count + ahead``.
        dropped: ``(parts, document id, stage name)`` of each piece a stage took out.
    """

    def __init__(
        self,
        pieces: list[list[Part]],
        ids: list[int],
        tail: list[Part],
        spans: np.ndarray,
        ahead: int,
        read: Reader,
    ):
        self.pieces = pieces
        self.ids = ids
        self.tail = tail
        self.spans = spans
        self.ahead = ahead
        self.dropped: list[tuple[list[Part], int, str]] = []
        self._read = read

    @property
    def length(self) -> int:
        """Tokens in the row (``seq_length + 1``)."""
        return self.content + parts_length(self.tail)

    @property
    def content(self) -> int:
        """Tokens before the tail."""
        return sum(parts_length(parts) for parts in self.pieces)

    def parts(self) -> list[Part]:
        """Every part of the row, in order: the pieces', then the tail."""
        return [part for parts in self.pieces for part in parts] + list(self.tail)

    def tokens(self, parts: Sequence[Part]) -> np.ndarray:
        """The int32 tokens of ``parts`` (document parts are read from the data)."""
        chunks = [self._part_tokens(part) for part in parts]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)

    def edges(self, k: int, n: int = 2) -> tuple[np.ndarray, np.ndarray]:
        """The first and the last ``min(n, size)`` tokens of piece ``k``, reading only
        those of document parts."""
        parts = self.pieces[k]
        size = parts_length(parts)
        m = min(n, size)
        return self.tokens(cut_parts(parts, 0, m)), self.tokens(cut_parts(parts, size - m, size))

    def drop(self, parts: list[Part], document_id: int, stage: str) -> None:
        """Record a piece a stage took out of the line."""
        self.dropped.append((list(parts), int(document_id), stage))

    def set_content(
        self, pieces: list[list[Part]], ids: Sequence[int], pad: int | None = None
    ) -> None:
        """The line's content as a stage left it, and what follows it in the row: ``pad``
        repeated (a stage that writes padding after its content), else the row's tokens
        from the new content's end on, as they were (a stage that writes only its content).

        Raises:
            ValueError: The content is longer than the row, or pieces and ids differ in
                number.
        """
        if len(pieces) != len(ids):
            raise ValueError(f"{len(pieces)} pieces but {len(ids)} document ids")
        length, content = self.length, sum(parts_length(parts) for parts in pieces)
        if content > length:
            raise ValueError(f"content of {content} tokens in a row of {length}")
        if pad is not None:
            self.tail = [Part("pad", length - content, token=int(pad))] if content < length else []
        else:
            self.tail = cut_parts(self.parts(), content, length)
        self.pieces = [list(parts) for parts in pieces]
        self.ids = [int(i) for i in ids]

    def _part_tokens(self, part: Part) -> np.ndarray:
        if part.is_doc:
            tokens = self._read(part.dataset, part.file, part.doc, part.start, part.length)
            return np.asarray(tokens).astype(np.int32, copy=False)
        return np.full(part.length, part.token, dtype=np.int32)
