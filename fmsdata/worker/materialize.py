"""Turn lines of spans into token rows, reading only the slices the spans name.

All spans of a batch part are handled together, in compiled loops: one pass over the
spans lays the rows out (``fmsdata.stages.kernels``: where each span's tokens land,
BOS/EOS/BOL/EOL and padding written in place), then one pass over them copies their
pieces straight from the memory-mapped token buffers of their files into the rows
(``fmsdata.transport.batchwrite.copy_spans``), checking that every token fits an int32 row and the
vocabulary. The copy may wait: a worker makes it a batch at a time as it writes the
batches. Formats without a flat token buffer, and buffers the copy cannot read by address
(byte-swapped or strided), are read through their handler one span at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fmsdata.config import Decoration
from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.stages.kernels import lay_out_lines
from fmsdata.stages.lineblock import LineBlock, as_block
from fmsdata.stages.spans import BASE, DLEN, DOC, DS, FILE
from fmsdata.transport.batchwrite import TOKEN_OUT_OF_RANGE, PendingCopy, source_kind

__all__ = ["LineWriter"]

_INT32_MAX = 2**31 - 1


def _token(token: int | None) -> int:
    """A delimiter for the kernels: -1 for none (token ids are non-negative)."""
    return -1 if token is None else token


class LineWriter:
    """Writes packed lines ``[BOL] documents... [EOL] [pad...]`` into int32 rows.

    Args:
        accesses: Dataset accesses by dataset index (the ``ds`` field of spans).
        decoration: BOS/EOS/stripping applied to documents.
        line_length: Tokens per line.
        bol, eol: Line delimiters or None.
        pad: Padding token (pad packing) or None.
        vocab_size: When set, token ids outside ``[0, vocab_size)`` raise ShardFormatError.

    Raises:
        ConfigError: A delimiter or BOS/EOS token that does not fit an int32 row, or is
            outside ``vocab_size``.
    """

    def __init__(
        self,
        accesses: Sequence[Any],
        decoration: Decoration,
        line_length: int,
        bol: int | None = None,
        eol: int | None = None,
        pad: int | None = None,
        vocab_size: int | None = None,
    ):
        self.accesses = list(accesses)
        self.decoration = decoration
        self.line_length = line_length
        self.bol = bol
        self.eol = eol
        self.pad = pad
        self.vocab_size = vocab_size
        delimiters = {"bol": bol, "eol": eol, "pad": pad}
        delimiters.update(bos=decoration.bos, eos=decoration.eos)
        for name, token in delimiters.items():
            if token is not None and not 0 <= token <= _INT32_MAX:
                raise ConfigError(
                    f"{name} token {token} does not fit the int32 rows: ids are below 2**31"
                )
            if token is not None and vocab_size is not None and token >= vocab_size:
                raise ConfigError(f"{name} token {token} is outside vocab_size={vocab_size}")
        # The largest token id a document may hold.
        self._limit = _INT32_MAX if vocab_size is None else min(_INT32_MAX, vocab_size - 1)
        self._first_file: np.ndarray | None = None  # each dataset's first dense file number

    @classmethod
    def for_config(cls, accesses: Sequence[Any], decoration: Any, config: Any) -> LineWriter:
        """The writer a loader config asks for: its line length, line delimiters, padding
        (``packing: pad`` or ``best_fit``) and vocabulary."""
        return cls(
            accesses,
            decoration,
            config.line_length,
            bol=config.bol_token,
            eol=config.eol_token,
            pad=config.lines.line_pad_token,
            vocab_size=config.vocab_size,
        )

    def settings(self) -> dict[str, Any]:
        """What the rows depend on besides the spans (the state fingerprint's ``writer``;
        the vocabulary is a check and changes no row)."""
        return {"line_length": self.line_length, "bol": self.bol, "eol": self.eol, "pad": self.pad}

    def write(self, lines: Sequence[np.ndarray] | LineBlock, out: np.ndarray) -> np.ndarray:
        """Fill row ``k`` of ``out`` from ``lines[k]``; return the non-pad token count per row.

        Raises:
            ShardFormatError: A token does not fit an int32 row, or is outside
                ``vocab_size``; or a span names tokens past its document's end (the files
                changed since the spans were made).
            ConfigError: Lines do not fit a row: packed for another line length (a config
                change met on resume) or changed by a stage.
        """
        fill, pending = self.lay_out(lines, out)
        pending.copy(out, 0, len(fill))
        return fill

    def lay_out(
        self, lines: Sequence[np.ndarray] | LineBlock, out: np.ndarray
    ) -> tuple[np.ndarray, PendingCopy]:
        """Write the delimiters and padding of the rows, and the pieces of formats without a
        flat token buffer; return the non-pad token count per row and the copy of the other
        pieces, still to be made (``PendingCopy.copy``: all at once, or a batch of lines at
        a time by ``fmsdata.transport.batchwrite.write_batches``).

        Raises:
            ShardFormatError: As ``write``; for the pieces still to copy, when copied.
            ValueError: ``out`` is not C-contiguous.
        """
        n_rows, width = out.shape
        if not out.flags.c_contiguous:
            raise ValueError("rows are written through a flat view: give C-contiguous rows")
        block = as_block(lines)
        if len(block) != n_rows:
            raise ValueError(f"{len(block)} lines for {n_rows} rows")
        counts, spans = block.counts, block.spans
        if (spans[:, DLEN] < 0).any():  # restored spans: found on a copy, the lines stay
            spans = spans.copy()
            self._find_facts(spans)
        dst = np.empty(len(spans), dtype=np.int64)
        first = np.empty(len(spans), dtype=np.int64)
        n_copy = np.empty(len(spans), dtype=np.int64)
        fill = lay_out_lines(
            spans,
            counts,
            out,
            _token(self.bol),
            _token(self.eol),
            _token(self.pad),
            _token(self.decoration.bos),
            _token(self.decoration.eos),
            dst,
            first,
            n_copy,
        )
        bad = np.flatnonzero((fill > width) | ((fill != width) if self.pad is None else False))
        if len(bad):
            raise self._misfit(fill, width, bad)
        return fill, self._pending(spans, out.reshape(-1), block.offsets, dst, first, n_copy)

    def _misfit(self, fill: np.ndarray, width: int, bad: np.ndarray) -> ConfigError:
        """The error of lines whose spans do not make a row of ``width`` tokens. Never the
        files: a line's length is its spans' lengths, and a span that no longer fits its
        document is refused where it is read or copied (``ShardFormatError``,
        ``StateMismatchError``). So the lines were packed for another line length (a
        config change met on resume) or a stage changed them."""
        line = int(bad[0])
        return ConfigError(
            f"lines of {width} tokens came out as {fill.tolist()} tokens (line {line}: "
            f"{int(fill[line])}): their spans hold another number of tokens than a line of "
            f"this loader (line_length={self.line_length}, bol={self.bol}, eol={self.eol}): "
            "lines of a loaded state packed for another line length (a state saved with "
            "another seq_length loads with allow_changes=['seq_length'], which re-packs its "
            "lines; another change of the lines' length, bol_token or eol_token, needs a new "
            "run), or a span-level stage of the chain changed the lines' spans"
        )

    def _pending(
        self,
        spans: np.ndarray,
        flat_out: np.ndarray,
        line_spans: np.ndarray,
        dst: np.ndarray,
        first: np.ndarray,
        n_copy: np.ndarray,
    ) -> PendingCopy:
        """The copy of each span's tokens from its file's flat token buffer, and for
        formats without one, the handler's own reads, made here."""
        keys, group = self._files(spans)
        addresses = np.zeros(len(keys), dtype=np.int64)
        sizes = np.zeros(len(keys), dtype=np.int64)
        kinds = np.zeros(len(keys), dtype=np.int64)
        buffers = []
        through_handler = []
        for g, (ds, file) in enumerate(keys):
            access = self.accesses[ds]
            buffer = access.handler.token_buffer(access.reader(file))
            kind = -1 if buffer is None else source_kind(buffer[0])
            if kind < 0:
                through_handler.append(g)
                continue
            tokens = buffer[0]
            buffers.append(tokens)
            addresses[g] = tokens.__array_interface__["data"][0]
            sizes[g], kinds[g] = len(tokens), kind
        span_source = group
        if through_handler:
            by_handler = np.isin(group, through_handler)
            for i in np.flatnonzero(by_handler & (n_copy > 0)).tolist():
                n, at = int(n_copy[i]), int(dst[i])
                ds, file = keys[int(group[i])]
                piece = self._handler_piece(spans[i], self.accesses[ds], file, int(first[i]), n)
                flat_out[at : at + n] = piece
            span_source = np.where(by_handler, -1, group)
        # A span without a buffer position (base -1) in a file with a buffer is refused as
        # out of bounds rather than copied from the wrong place.
        src = np.where(spans[:, BASE] < 0, -1, first + spans[:, BASE])

        def refuse(outcome: int, i: int) -> None:
            ds, file = keys[int(group[i])]
            self._refuse(outcome, spans[i], self.accesses[ds], file, int(sizes[group[i]]))

        return PendingCopy(
            line_spans, addresses, sizes, kinds, span_source, src, dst, n_copy, self._limit,
            buffers, refuse,
        )  # fmt: skip

    def _handler_piece(
        self, span: np.ndarray, access: Any, file: int, first: int, n: int
    ) -> np.ndarray:
        """A span's tokens read through the handler (formats without a flat token
        buffer), checked to fit an int32 row."""
        doc = int(span[DOC])
        strip = self.decoration.strip
        tokens = access.handler.get(access.reader(file), doc)
        lead = int(bool(strip) and len(tokens) > 0 and int(tokens[0]) in strip)
        piece = access.handler.slice(tokens, lead + first, n)
        if len(piece) != n:
            raise ShardFormatError(
                f"{access.path(file)}: document {doc} holds fewer tokens than its spans "
                f"name ({len(piece)} from token {lead + first}, not {n}): the file changed "
                "since the spans were made"
            )
        if len(piece) and (int(piece.max()) > self._limit or int(piece.min()) < 0):
            self._refuse(TOKEN_OUT_OF_RANGE, span, access, file, len(piece))
        return piece

    def _refuse(self, outcome: int, span: np.ndarray, access: Any, file: int, size: int) -> None:
        """Raise the ShardFormatError for a piece ``copy_spans`` stopped at (``size``:
        tokens in the file's buffer)."""
        doc = int(span[DOC])
        if outcome == TOKEN_OUT_OF_RANGE:
            values = access.handler.get(access.reader(file), doc)
            bad = values[(values < 0) | (values > _INT32_MAX)]
            if bad.size or self.vocab_size is None:
                shown = int(bad[0]) if bad.size else "?"
                raise ShardFormatError(
                    f"{access.path(file)}: document {doc} holds a token id outside "
                    f"[0, 2**31): {shown}"
                )
            bad = values[values >= self.vocab_size]
            shown = int(bad[0]) if bad.size else "?"
            raise ShardFormatError(
                f"{access.path(file)}: document {doc} holds token id {shown}, outside "
                f"vocab_size={self.vocab_size}"
            )
        raise ShardFormatError(
            f"{access.path(file)}: document {doc} (token {int(span[BASE])} on, "
            f"{size} tokens in the file) does not hold the tokens its spans name: "
            "the file changed since the spans were made"
        )

    def _files(self, spans: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
        """The ``(dataset, file)`` pairs the spans read, and each span's index into them:
        files numbered densely across datasets, so grouping is a bincount, not a sort."""
        if self._first_file is None:
            counts = [access.num_files for access in self.accesses]
            self._first_file = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        first = self._first_file
        global_file = first[spans[:, DS]] + spans[:, FILE]
        used = np.flatnonzero(np.bincount(global_file, minlength=int(first[-1])))
        number = np.zeros(int(first[-1]), dtype=np.int64)
        number[used] = np.arange(len(used))
        ds = np.searchsorted(first, used, side="right") - 1
        keys = list(zip(ds.tolist(), (used - first[ds]).tolist()))
        return keys, number[global_file]

    def _find_facts(self, spans: np.ndarray) -> None:
        """Fill in ``dlen`` and ``base`` of spans restored from a saved state."""
        unknown = np.flatnonzero(spans[:, DLEN] < 0)
        decoration = self.decoration
        for i in unknown.tolist():
            ds, file, doc = (int(v) for v in spans[i, [DS, FILE, DOC]])
            access = self.accesses[ds]
            docs = np.array([doc], dtype=np.int64)
            lengths, lead, trail, starts = access.measure(file, docs, decoration)
            spans[i, DLEN] = int(lengths[0] - lead[0] - trail[0]) + decoration.extra
            spans[i, BASE] = int(starts[0] + lead[0]) if starts is not None else -1
