"""The ``output`` section: what a batch holds and in what form."""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from fmsdata.config.section import Section, checked
from fmsdata.config.values import flag, number, one_of, positive_int
from fmsdata.errors import ConfigError

__all__ = ["OutputConfig", "BatchFormat", "OutputDtype", "BATCH_FORMATS", "OUTPUT_DTYPES"]

BatchFormat = Literal["dict", "tuple"]
OutputDtype = Literal["int64", "int32"]
BATCH_FORMATS: tuple[str, ...] = get_args(BatchFormat)
OUTPUT_DTYPES: tuple[str, ...] = get_args(OutputDtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputConfig(Section):
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

    batch_size: int = checked(8, positive_int)
    batch_format: BatchFormat = checked("dict", one_of(BATCH_FORMATS))
    output_dtype: OutputDtype = checked("int64", one_of(OUTPUT_DTYPES))
    # Its upper bound, seq_length, is the lines section's: LoaderConfig checks it.
    ignore_first_labels: int = checked(
        0, number(int, "an integer from 0 to seq_length", lambda n: n >= 0)
    )
    return_position_ids: bool = checked(False, flag)
    return_cu_seqlens: bool = checked(False, flag)
    return_document_ids: bool = checked(False, flag)
    return_step_digest: bool = checked(False, flag)
    vocab_size: int | None = checked(
        None, number(int, "positive or None", lambda n: n > 0, optional=True)
    )

    def _check(self) -> None:
        if self.output_dtype == "int32" and self.return_document_ids:
            raise ConfigError(
                "return_document_ids needs output_dtype='int64' (an id is "
                "dataset << 56 | file << 32 | doc), got output_dtype='int32'"
            )
