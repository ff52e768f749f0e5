"""A delivered row as the trace tells it: where each of its tokens came from.

A line of spans (``fmsdata.stages.spans``) names decorated documents: BOS, the stored
tokens left after ``strip_tokens``, EOS. Its row is ``[BOL] spans... [EOL] [padding]``
(``fmsdata.worker.materialize``). ``LineTracer`` turns the spans into parts
(``fmsdata.stages.traced``: stored tokens by document and first token, inserted tokens by
kind), measuring each document as the loader does (its length from the format's metadata,
and the stripped edge tokens where ``strip_tokens`` is set), then hands the line to each
token-level stage of the shard's chain (``TokenStage.trace``). A stage that cannot say what
it does is named, and the row is told as it was before it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from fmsdata.config import Decoration
from fmsdata.errors import ShardFormatError
from fmsdata.stages.base import TokenStage, traceable
from fmsdata.stages.outputs import document_ids_of
from fmsdata.stages.spans import DOC, DS, FILE, LENGTH, START
from fmsdata.stages.traced import NotTraceable, Part, TracedLine, parts_length

__all__ = ["RowTrace", "LineTracer", "stage_label"]


def stage_label(stage: TokenStage) -> str:
    cls = type(stage)
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclasses.dataclass
class RowTrace:
    """One row of a global step.

    Attributes:
        rank, row: Where the row was delivered.
        shard, line: The logical shard that made it and the line's index in the shard
            (lines from the run's start).
        parts: Every part of the row, in order (``seq_length + 1`` tokens: the inputs
            are the first ``seq_length``, the last is only a label).
        content: Tokens before the padding (labels past ``content - 1`` are ignored).
        dropped: Pieces a token stage took out: ``(parts, document id, stage)``.
        not_followed: Token stages the trace could not follow (the row is told as it
            was before the first of them).
    """

    rank: int
    row: int
    shard: int
    line: int
    parts: list[Part]
    content: int
    dropped: list[tuple[list[Part], int, str]]
    not_followed: list[str]

    def placed(self) -> list[tuple[int, Part]]:
        """Each part with its position in the row."""
        out, at = [], 0
        for part in self.parts:
            out.append((at, part))
            at += part.length
        return out

    def to_plain(self, accesses: Sequence[Any]) -> dict[str, Any]:
        """JSON-able: the document pieces in input order (``dataset``, ``file`` relative
        to the data root, ``doc``, ``start``, ``length``, and ``at``: the first position in
        the row), the inserted tokens, the padding and what was dropped."""
        pieces, inserted = [], []
        for at, part in self.placed():
            if part.is_doc:
                pieces.append({**_document(part, accesses), "at": at})
                if part.role:
                    pieces[-1]["role"] = part.role
            else:
                inserted.append(
                    {"at": at, "length": part.length, "kind": part.kind, "token": part.token}
                )
        out: dict[str, Any] = {
            "rank": self.rank,
            "row": self.row,
            "shard": self.shard,
            "line": self.line,
            "pieces": pieces,
            "inserted": inserted,
            "content": self.content,
        }
        if self.dropped:
            out["dropped"] = [
                {"by": stage, "pieces": [_document(p, accesses) for p in parts if p.is_doc]}
                for parts, _, stage in self.dropped
            ]
        if self.not_followed:
            out["not_followed"] = list(self.not_followed)
        return out


def _document(part: Part, accesses: Sequence[Any]) -> dict[str, Any]:
    access = accesses[part.dataset]
    return {
        "dataset": access.name,
        "file": access.path(part.file),
        "doc": part.doc,
        "start": part.start,
        "length": part.length,
    }


@dataclasses.dataclass
class LineTracer:
    """Tells a shard's lines as rows of parts.

    Attributes:
        accesses: The datasets' files, by the dataset index of spans.
        decoration: BOS/EOS and stripping.
        line_length: Tokens in a row.
        bol, eol: Line delimiters (None: none).
        pad: The padding token of ``packing: pad`` (None: lines are full).
    """

    accesses: Sequence[Any]
    decoration: Decoration
    line_length: int
    bol: int | None
    eol: int | None
    pad: int | None

    def row(
        self,
        spans: np.ndarray,
        token_stages: Sequence[TokenStage],
        ahead: int,
        rank: int = -1,
        row: int = -1,
        shard: int = -1,
        line: int = -1,
    ) -> RowTrace:
        """The row a line of ``spans`` became after ``token_stages`` (the shard's, their
        state ``ahead`` lines before this line)."""
        traced = self.line(spans, ahead)
        not_followed: list[str] = []
        for k, stage in enumerate(token_stages):
            try:
                if not traceable(stage):
                    raise NotTraceable(stage_label(stage))
                stage.trace(traced)
            except NotTraceable:
                not_followed = [stage_label(s) for s in token_stages[k:]]
                break
        parts, content, dropped = traced.parts(), traced.content, traced.dropped
        return RowTrace(rank, row, shard, line, parts, content, dropped, not_followed)

    def line(self, spans: np.ndarray, ahead: int = 0) -> TracedLine:
        """The line of ``spans`` as parts, before any token stage.

        Raises:
            ShardFormatError: A span names more tokens than its document holds (the files
                changed since the state was saved).
        """
        pieces = [self._span_parts(span) for span in np.asarray(spans, dtype=np.int64)]
        if pieces and self.bol is not None:
            pieces[0].insert(0, Part("bol", 1, token=self.bol))
        if pieces and self.eol is not None:
            pieces[-1].append(Part("eol", 1, token=self.eol))
        content = sum(parts_length(parts) for parts in pieces)
        tail = []
        if content < self.line_length:
            if self.pad is None:
                raise ShardFormatError(
                    f"a line of {content} tokens where rows hold {self.line_length} and "
                    "packing does not pad: the files changed since the state was saved"
                )
            tail = [Part("pad", self.line_length - content, token=self.pad)]
        ids = document_ids_of(np.asarray(spans, dtype=np.int64)).tolist()
        return TracedLine(pieces, ids, tail, spans, ahead, self.read)

    def _span_parts(self, span: np.ndarray) -> list[Part]:
        """A span's parts: the decorated document's BOS, stored tokens and EOS that fall in
        ``[start, start + length)``."""
        ds, file, doc = int(span[DS]), int(span[FILE]), int(span[DOC])
        begin, end = int(span[START]), int(span[START]) + int(span[LENGTH])
        lead, content = self._measure(ds, file, doc)
        d = self.decoration
        bos = int(d.bos is not None)
        size = bos + content + int(d.eos is not None)
        if end > size:
            access = self.accesses[ds]
            raise ShardFormatError(
                f"{access.path(file)}: document {doc} holds {size} tokens with its delimiters, "
                f"a line names tokens {begin} to {end}: the file changed since the state "
                "was saved"
            )
        parts = []
        if begin < bos:
            parts.append(Part("bos", 1, token=int(d.bos)))  # type: ignore[arg-type]
        lo, hi = max(begin, bos), min(end, bos + content)
        if lo < hi:
            parts.append(
                Part("doc", hi - lo, dataset=ds, file=file, doc=doc, start=lead + lo - bos)
            )
        if end > bos + content:
            parts.append(Part("eos", 1, token=int(d.eos)))  # type: ignore[arg-type]
        return parts

    def _measure(self, ds: int, file: int, doc: int) -> tuple[int, int]:
        """The tokens ``strip_tokens`` removes from the document's start, and the stored
        tokens kept, measured as the document stream measures them."""
        lengths, lead, trail, _ = self.accesses[ds].measure(
            file, np.array([doc], dtype=np.int64), self.decoration
        )
        return int(lead[0]), int(lengths[0] - lead[0] - trail[0])

    def read(self, ds: int, file: int, doc: int, start: int, length: int) -> np.ndarray:
        """Stored tokens ``[start, start + length)`` of a document, as the line writer reads
        them (``fmsdata.worker.materialize``).

        Raises:
            ShardFormatError: The document holds fewer.
        """
        access = self.accesses[ds]
        handler = access.handler
        tokens = handler.slice(handler.get(access.reader(file), doc), start, length)
        if len(tokens) != length:
            raise ShardFormatError(
                f"{access.path(file)}: document {doc} holds fewer tokens than a traced piece "
                f"names ({len(tokens)} from token {start}, not {length}): the file changed"
            )
        return np.asarray(tokens)
