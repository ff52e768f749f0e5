"""One unit of a tokenize run: its input pieces tokenized into one output shard.

This is the function every backend runs (in-process, a worker process, a Ray task), so
they all write the same bytes. The shard is written to a temporary name and renamed;
the unit's record (counts, bad records, input hashes) is written after it, also by
rename, and a unit counts as done only when both exist.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.arrow import write_arrow_docs
from fmsdata.handlers.megatron import write_megatron
from fmsdata.handlers.text import TextTokenizer
from fmsdata.tokenize.inputs import InputFile, describe_position, read_piece
from fmsdata.tokenize.plan import EOS_FORMATS, TokenizeSpec, Unit
from fmsdata.tokenize.writers import write_flat, write_mds_shard, write_pbin

__all__ = ["tokenize_unit", "unit_done", "read_record", "write_json_atomic", "file_sha256"]

TEXTS_PER_BATCH = 256  # texts per encode_batch call

_tokenizers: dict[str, TextTokenizer] = {}


def _tokenizer(path: str) -> TextTokenizer:
    """The tokenizer of a path, loaded once per process."""
    if path not in _tokenizers:
        _tokenizers[path] = TextTokenizer(path)
    return _tokenizers[path]


def file_sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_json_atomic(path: str, data: Any) -> None:
    """``data`` as sorted, indented JSON at ``path``, via a temporary name and a rename."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.tmp{os.getpid()}"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2, sort_keys=True)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


def unit_done(spec: TokenizeSpec, unit: int) -> bool:
    """Whether a unit's shard and record are both in place."""
    return os.path.exists(spec.record_path(unit)) and os.path.exists(
        os.path.join(spec.output_dir, spec.shard_name(unit))
    )


def read_record(spec: TokenizeSpec, unit: int) -> dict[str, Any]:
    with open(spec.record_path(unit), encoding="utf-8") as handle:
        return json.load(handle)


class _Tally:
    """Documents, tokens and bad records of one unit as its documents stream past;
    ``report(documents, tokens)`` hears the increments after each encoded batch."""

    def __init__(self, report: Callable[[int, int], None] | None) -> None:
        self.documents = 0
        self.tokens = 0
        self.empty = 0
        self.bad: dict[str, dict[str, int]] = {}
        self.report = report

    def problem(self, path: str, what: str) -> None:
        per_file = self.bad.setdefault(path, {})
        per_file[what] = per_file.get(what, 0) + 1


def _documents(
    spec: TokenizeSpec, inputs: Sequence[InputFile], unit: Unit, tally: _Tally
) -> Iterator[np.ndarray]:
    """The unit's documents as token arrays, in input order."""
    tokenizer = _tokenizer(spec.tokenizer)
    dtype = tokenizer.dtype
    batch: list[str] = []

    def encoded() -> Iterator[np.ndarray]:
        if not batch:
            return
        kept = [ids for ids in tokenizer.encode(batch) if ids]
        tally.empty += len(batch) - len(kept)
        batch.clear()
        tokens = sum(len(ids) for ids in kept)
        tally.documents += len(kept)
        tally.tokens += tokens
        if tally.report is not None:
            tally.report(len(kept), tokens)
        for ids in kept:
            yield np.asarray(ids, dtype=dtype)

    for piece in unit.pieces:
        file = inputs[piece.file]
        for where, text, problem in read_piece(file, piece, spec.text_field):
            if text is None:
                if spec.strict:
                    raise ShardFormatError(f"{describe_position(file, where)}: {problem}")
                tally.problem(file.path, problem or "unreadable")
                continue
            batch.append(text)
            if len(batch) == TEXTS_PER_BATCH:
                yield from encoded()
    yield from encoded()


def _eos(spec: TokenizeSpec) -> int:
    if spec.eos_token is None:  # run_tokenize resolves it before any unit runs
        raise ConfigError(f"--format {spec.output_format} needs an end-of-document token")
    return spec.eos_token


def tokenize_unit(
    spec: TokenizeSpec,
    inputs: Sequence[InputFile],
    unit: Unit,
    report: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Tokenize one unit into its shard and write its record; returns the record.
    ``report(documents, tokens)`` is told of progress as batches are encoded."""
    tally = _Tally(report)
    target = os.path.join(spec.output_dir, spec.shard_name(unit.index))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    dtype = _tokenizer(spec.tokenizer).dtype
    documents = _documents(spec, inputs, unit, tally)
    mds_entry = None
    if spec.output_format == "arrow":
        write_arrow_docs(target, documents, col_name=spec.col_name, dtype=dtype)
    elif spec.output_format == "megatron":
        # Megatron's index has no uint32 code: larger vocabularies go to int32, as there.
        wide = np.dtype(np.int32) if dtype == np.uint32 else dtype
        write_megatron(target[: -len(".idx")], documents, dtype=wide)
    elif spec.output_format == "flat":
        write_flat(target, documents, _eos(spec), dtype)
    elif spec.output_format == "pbin":
        write_pbin(target, documents, _eos(spec), dtype)
    else:
        mds_entry = write_mds_shard(target, documents, dtype)
    hashes = {
        inputs[p.file].path: file_sha256(inputs[p.file].path) for p in unit.pieces if p.start == 0
    }
    record = {
        "unit": unit.index,
        "shard": spec.shard_name(unit.index),
        "documents": tally.documents,
        # As stored: with the end-of-document token of the formats that write one.
        "tokens": tally.tokens + (tally.documents if spec.output_format in EOS_FORMATS else 0),
        "empty_documents": tally.empty,
        "bad_records": tally.bad,
        "input_bytes": unit.weight,
        "input_sha256": hashes,
    }
    if mds_entry is not None:
        record["mds_entry"] = mds_entry
    write_json_atomic(spec.record_path(unit.index), record)
    return record
