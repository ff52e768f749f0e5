"""The ``lines`` section: how documents are packed into training lines and shuffled.

(The issue's "packing" section: named ``lines`` because ``packing`` is already the name of
one of its fields, the packing mode, which configs and ``config.packing`` keep reading.)
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from fmsdata.config.values import (
    choice,
    non_negative_int,
    optional_token,
    positive_int,
    set_field,
)
from fmsdata.errors import ConfigError

__all__ = ["LinesConfig", "PackingMode", "PACKING_MODES"]

PackingMode = Literal["hard", "pad"]
PACKING_MODES: tuple[str, ...] = get_args(PackingMode)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinesConfig:
    """The packed lines: their length, delimiters, padding and shuffle buffer.

    Attributes:
        seq_length: Tokens per training sequence; packed lines hold ``seq_length + 1``.
        packing: ``"hard"`` splits documents to fill every line; ``"pad"`` starts a new
            line rather than splitting and fills the rest with ``pad_token``.
        pad_token: Padding token id (required by ``packing="pad"``).
        bol_token, eol_token: Added at the start / end of every packed line when set.
        shuffle_window: Lines held in the shuffle buffer of each logical shard (0 or 1 = off;
            not used with ``document_order: sequential``).
    """

    seq_length: int = 4096
    packing: PackingMode = "hard"
    pad_token: int | None = None
    bol_token: int | None = None
    eol_token: int | None = None
    shuffle_window: int = 160

    def __post_init__(self) -> None:
        for name in ("bol_token", "eol_token", "pad_token"):
            set_field(self, name, optional_token(name, getattr(self, name)))
        set_field(self, "seq_length", positive_int("seq_length", self.seq_length))
        set_field(self, "shuffle_window", non_negative_int("shuffle_window", self.shuffle_window))
        choice("packing", self.packing, PACKING_MODES)
        if self.packing == "pad" and self.pad_token is None:
            raise ConfigError("packing='pad' needs pad_token, got pad_token=None")
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
    def content_capacity(self) -> int:
        """Document tokens that fit in one line after the line delimiters."""
        return self.line_length - (self.bol_token is not None) - (self.eol_token is not None)
