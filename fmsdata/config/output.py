"""The ``output`` section: what a batch holds and in what form."""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from fmsdata.config.values import choice, flag, positive_int, set_field, to_number
from fmsdata.errors import ConfigError

__all__ = ["OutputConfig", "BatchFormat", "OutputDtype", "BATCH_FORMATS", "OUTPUT_DTYPES"]

BatchFormat = Literal["dict", "tuple"]
OutputDtype = Literal["int64", "int32"]
BATCH_FORMATS: tuple[str, ...] = get_args(BatchFormat)
OUTPUT_DTYPES: tuple[str, ...] = get_args(OutputDtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """The batches a rank receives: their size, tensors, dtype and form.

    Attributes:
        batch_size: Sequences per batch on this rank.
        batch_format: ``"dict"`` (named tensors) or ``"tuple"``: the same tensors in the
            batch's key order, ``(input_ids, labels, ...)`` (a preprocess's keys sorted),
            for loops written ``for input, label in loader``; a batch of one tensor is
            that tensor.
        output_dtype: ``"int64"`` or ``"int32"``: the dtype the workers write the per-token
            outputs in (fms-fsdp's batches are int32; ``document_ids`` need int64).
        ignore_first_labels: Labels at the start of every line set to -100, ignored by the
            loss (fms-fsdp's ``causal_lm`` ignores the first); at most ``seq_length``.
        return_position_ids: Add ``position_ids`` restarting at each document.
        return_cu_seqlens: Add ``cu_seqlens`` and ``max_seqlen`` for varlen attention.
        return_document_ids: Add ``document_ids``: per input token, the id of its source
            document (``dataset << 56 | file << 32 | doc``, -1 on padding; see
            ``fmsdata.stages.outputs``), for document masks.
        return_step_digest: Add ``step_digest``: a short digest of this rank's
            ``input_ids`` and ``labels`` (an int64 scalar tensor; ``fmsdata.util.digest``),
            to log per step and check against the data with ``fmsdata trace --verify``.
        vocab_size: When set, a token id at or above it is an error naming the file.
            Unset: the tokenizer's size the root's ``metadata.json`` records; a set one
            must not be smaller (larger is a model's padded vocabulary).
    """

    batch_size: int = 8
    batch_format: BatchFormat = "dict"
    output_dtype: OutputDtype = "int64"
    ignore_first_labels: int = 0
    return_position_ids: bool = False
    return_cu_seqlens: bool = False
    return_document_ids: bool = False
    return_step_digest: bool = False
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        set_field(self, "batch_size", positive_int("batch_size", self.batch_size))
        choice("batch_format", self.batch_format, BATCH_FORMATS)
        choice("output_dtype", self.output_dtype, OUTPUT_DTYPES)
        first = self.ignore_first_labels
        if not isinstance(first, int) or isinstance(first, bool) or first < 0:
            # Its upper bound, seq_length, is the lines section's: LoaderConfig checks it.
            raise ConfigError(
                f"ignore_first_labels must be an integer from 0 to seq_length, got {first!r}"
            )
        for name in (
            "return_position_ids",
            "return_cu_seqlens",
            "return_document_ids",
            "return_step_digest",
        ):
            flag(name, getattr(self, name))
        if self.output_dtype == "int32" and self.return_document_ids:
            raise ConfigError(
                "return_document_ids needs output_dtype='int64' (an id is "
                "dataset << 56 | file << 32 | doc), got output_dtype='int32'"
            )
        if self.vocab_size is not None:
            vocab = to_number("vocab_size", self.vocab_size, int)
            if vocab < 1:
                raise ConfigError(f"vocab_size must be positive or None, got {self.vocab_size!r}")
            set_field(self, "vocab_size", vocab)
