"""The ``lines`` section: how documents are packed into training lines and shuffled.

(The issue's "packing" section: named ``lines`` because ``packing`` is already the name of
one of its fields, the packing mode, which configs and ``config.packing`` keep reading.)
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from fmsdata.config.section import Section, checked
from fmsdata.config.values import non_negative_int, one_of, optional_token, positive_int
from fmsdata.errors import ConfigError

__all__ = ["LinesConfig", "PackingMode", "PACKING_MODES"]

PackingMode = Literal["hard", "pad", "best_fit"]
PACKING_MODES: tuple[str, ...] = get_args(PackingMode)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinesConfig(Section):
    """The packed lines: their length, delimiters, padding and shuffle buffer.

    Attributes:
        seq_length: Tokens per training sequence; packed lines hold ``seq_length + 1``.
        packing: ``"hard"`` splits documents to fill every line; ``"pad"`` starts a new
            line rather than splitting and fills the rest with ``pad_token``;
            ``"best_fit"`` places the documents of a window of ``pack_window`` documents
            longest first, each into the open line it fills best, and pads what is left
            (only documents longer than a line are cut, into line-sized pieces).
        pad_token: Padding token id (required by ``packing="pad"`` and ``"best_fit"``).
        bol_token, eol_token: Added at the start / end of every packed line when set.
        shuffle_window: Lines held in the shuffle buffer of each logical shard (0 or 1 = off;
            not used with ``document_order: sequential``).
        pack_window: Documents of each logical shard packed together by
            ``packing="best_fit"``: a line stays open for at most two windows, so a
            document moves at most that far and the state holds at most about two windows
            of documents. Choose it so that a window holds at least a line's worth of
            tokens (``pack_window`` x mean document length >= ``seq_length``); not used
            by the other packings.
    """

    seq_length: int = checked(4096, positive_int)
    packing: PackingMode = checked("hard", one_of(PACKING_MODES))
    pad_token: int | None = checked(None, optional_token)
    bol_token: int | None = checked(None, optional_token)
    eol_token: int | None = checked(None, optional_token)
    shuffle_window: int = checked(160, non_negative_int)
    pack_window: int = checked(128, positive_int)

    def _check(self) -> None:
        if self.packing != "hard" and self.pad_token is None:
            raise ConfigError(f"packing={self.packing!r} needs pad_token, got pad_token=None")
        if self.content_capacity < 1:
            raise ConfigError(
                f"seq_length={self.seq_length} leaves no room for document tokens "
                "between bol_token and eol_token"
            )

    @property
    def line_length(self) -> int:
        """Tokens in one packed line: one more than ``seq_length`` for the causal shift."""
        return self.seq_length + 1

    @property
    def line_pad_token(self) -> int | None:
        """The token written after a line's documents: ``pad_token``, or None with hard
        packing, which fills every line."""
        return None if self.packing == "hard" else self.pad_token

    @property
    def content_capacity(self) -> int:
        """Document tokens that fit in one line after the line delimiters."""
        return self.line_length - (self.bol_token is not None) - (self.eol_token is not None)
