"""The ``documents`` section, and ``Decoration``: the part of it that decides a
document's tokens (what the data layer counts and the stages write)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

import numpy as np

from fmsdata.config.section import Section, checked
from fmsdata.config.values import non_negative_int, one_of, optional_token, split_csv

__all__ = ["DocumentsConfig", "Decoration", "DocumentOrder", "DOCUMENT_ORDERS"]

DocumentOrder = Literal["random", "sequential"]
DOCUMENT_ORDERS: tuple[str, ...] = get_args(DocumentOrder)


@dataclasses.dataclass(frozen=True)
class Decoration:
    """How a stored document becomes the token sequence the packer sees.

    Up to one leading and one trailing token found in ``strip`` is removed, then ``bos``
    and ``eos`` are added when set. Documents with fewer than ``min_length`` tokens left
    (and always empty ones) are skipped and counted.

    Built from the ``documents`` section (``DocumentsConfig.decoration``); a value of its
    own because the data layer keys what it measures of a file by it, which the section's
    ``document_order`` does not change.
    """

    bos: int | None = None
    eos: int | None = None
    strip: frozenset[int] = frozenset()
    min_length: int = 1

    @property
    def extra(self) -> int:
        return (self.bos is not None) + (self.eos is not None)

    @property
    def longest_skipped(self) -> int:
        """The most stored tokens a skipped document can hold: a file holding more tokens
        than this times its documents holds a kept one."""
        return max(1, self.min_length) - 1 + (2 if self.strip else 0)

    def strip_amounts(
        self, lengths: np.ndarray, first: np.ndarray, last: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tokens removed at the start and at the end of each document (0 or 1 each)."""
        if not self.strip:
            zeros = np.zeros(len(lengths), dtype=np.int64)
            return zeros, zeros
        strip = np.fromiter(self.strip, dtype=np.int64)
        lead = ((lengths > 0) & np.isin(first, strip)).astype(np.int64)
        trail = ((lengths - lead > 0) & np.isin(last, strip)).astype(np.int64)
        return lead, trail


def _token_ids(field: str, value: Any) -> tuple[int, ...]:
    return tuple(optional_token(field, token) for token in split_csv(field, value) or ())


@dataclasses.dataclass(frozen=True, kw_only=True)
class DocumentsConfig(Section):
    """Document delimiters, stripping, the length floor and the document order.

    Attributes:
        bos_token, eos_token: Added at the start / end of every document when set; a
            document that already starts / ends with that token (``pbin``, ``npy``, or as
            the root's ``metadata.json`` records) keeps just one. Elsewhere a file most of
            whose sampled documents already carry it is refused (``fmsdata.data.delimiters``):
            list it in ``strip_tokens``, or unset the field. Unset ``eos_token`` is
            the EOS the root's ``metadata.json`` records; a set one must agree with it,
            as must a set ``bos_token`` with the tokenizer's BOS recorded there.
        strip_tokens: Token ids removed when found as the first or last token of a document
            (for data that already carries its own BOS/EOS).
        min_length: Documents with fewer tokens (after stripping) are skipped and counted.
        document_order: ``"random"`` (a keyed walk per epoch, lines shuffled) or
            ``"sequential"`` (files in order, documents in stored order, no shuffle buffer:
            continuous packing).
    """

    bos_token: int | None = checked(None, optional_token)
    eos_token: int | None = checked(None, optional_token)
    strip_tokens: tuple[int, ...] = checked((), _token_ids)
    min_length: int = checked(1, non_negative_int)
    document_order: DocumentOrder = checked("random", one_of(DOCUMENT_ORDERS))

    @property
    def decoration(self) -> Decoration:
        """What this section does to each document's tokens."""
        return Decoration(
            bos=self.bos_token,
            eos=self.eos_token,
            strip=frozenset(self.strip_tokens),
            min_length=self.min_length,
        )
