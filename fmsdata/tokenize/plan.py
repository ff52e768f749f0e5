"""What a tokenize run produces: its settings, its output shards (units) and their names.

Inputs are cut into pieces (``inputs.split_input``) and consecutive pieces are grouped
into *units* of about ``shard_bytes`` of input each; a unit becomes one output shard. The
plan depends only on the inputs and the settings, never on how many processes or machines
run it, which is what makes the output identical whatever runs it: worker counts only
change which process writes which shard. ``--num-shards K --shard-id i`` (SLURM arrays)
takes every K-th unit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence

from fmsdata.errors import ConfigError
from fmsdata.tokenize.inputs import InputFile, Piece, split_input
from fmsdata.util.textcorpus import BUNDLED_TOKENIZERS, TOKENIZER_HINT, resolve_tokenizer
from fmsdata.util.urls import local_path

__all__ = [
    "TokenizeSpec",
    "Unit",
    "plan_units",
    "auto_shard_bytes",
    "select_units",
    "OUTPUT_FORMATS",
    "EOS_FORMATS",
]

OUTPUT_FORMATS = ("arrow", "megatron", "flat", "pbin", "mds")
# Formats whose documents carry their end-of-document token in the file.
EOS_FORMATS = ("flat", "pbin")
# Without --shard-size: the inputs' total over AUTO_SHARDS, within these bounds, so that up
# to AUTO_SHARDS workers (or SLURM tasks) each get a shard of small inputs, and large
# inputs get shards of at most 256 MB.
AUTO_SHARDS = 64
AUTO_SHARD_BYTES = (1 << 20, 256 << 20)
_ENDINGS = {"arrow": ".arrow", "megatron": ".idx", "flat": ".bin", "pbin": ".pbin"}


@dataclasses.dataclass(frozen=True)
class TokenizeSpec:
    """Settings of a tokenize run (everything the output depends on, and where it goes).

    Args:
        output_dir: The data root written: ``<output_dir>/<dataset>/shard-NNNNN.arrow``,
            ``meta/counts.csv`` and ``metadata.json``.
        dataset: Dataset folder the shards go to.
        tokenizer: Path of a ``tokenizers`` ``tokenizer.json``.
        text_field: JSON field / Parquet column holding the text.
        shard_bytes: Input bytes per output shard (large plain JSONL and Parquet files are
            split to this size, small files grouped up to it); None: ``auto_shard_bytes``
            of the inputs (resolved by ``run_tokenize``, and stored in the plan).
        output_format: ``arrow`` (Bamba layout), ``megatron`` (``.bin`` + ``.idx``),
            ``flat`` (tatm / OLMo: headerless ``.bin`` token streams, EOS after every
            document, a ``.json`` dtype sidecar), ``pbin`` (Modalities) or ``mds``
            (MosaicML streaming, ``ndarray`` column ``tokens``).
        col_name: Token column of Arrow shards.
        eos_token: End-of-document token written after every document by ``flat`` and
            ``pbin`` (resolved from the tokenizer's special tokens when not given).
        strict: A bad input record is an error (file and line) instead of being counted.
    """

    output_dir: str
    dataset: str
    tokenizer: str
    text_field: str = "text"
    shard_bytes: int | None = None
    output_format: str = "arrow"
    col_name: str = "tokens"
    strict: bool = False
    eos_token: int | None = None

    def __post_init__(self) -> None:
        if self.output_format not in OUTPUT_FORMATS:
            raise ConfigError(
                f"output format must be one of {OUTPUT_FORMATS}, got {self.output_format!r}"
            )
        if self.shard_bytes is not None and self.shard_bytes < 1:
            raise ConfigError(f"shard_bytes must be positive, got {self.shard_bytes!r}")
        if not self.dataset or "/" in self.dataset or self.dataset in (".", "..", "meta"):
            raise ConfigError(f"dataset must be a plain folder name, got {self.dataset!r}")
        output = local_path(
            self.output_dir,
            "output_dir",
            "tokenize writes a local data root; upload it once written",
        )
        object.__setattr__(self, "output_dir", output)
        tokenizer = local_path(self.tokenizer, "tokenizer", TOKENIZER_HINT)
        object.__setattr__(self, "tokenizer", resolve_tokenizer(tokenizer))
        if not os.path.isfile(self.tokenizer):
            raise ConfigError(
                f"tokenizer {self.tokenizer!r} is not a file (a tokenizer.json, or the name of a "
                f"bundled one: {', '.join(BUNDLED_TOKENIZERS)})"
            )

    @property
    def work_dir(self) -> str:
        """Where per-shard records and the plan live: ``meta/tokenize/<dataset>``."""
        return os.path.join(self.output_dir, "meta", "tokenize", self.dataset)

    def shard_name(self, unit: int) -> str:
        """The output file of a unit, relative to the output root (Megatron: the ``.idx``)."""
        if self.output_format == "mds":  # streaming's own shard names
            return f"{self.dataset}/shard.{unit:05d}.mds"
        return f"{self.dataset}/shard-{unit:05d}{_ENDINGS[self.output_format]}"

    def record_path(self, unit: int) -> str:
        return os.path.join(self.work_dir, f"shard-{unit:05d}.json")


@dataclasses.dataclass(frozen=True)
class Unit:
    """One output shard's worth of input pieces."""

    index: int
    pieces: tuple[Piece, ...]

    @property
    def weight(self) -> int:
        return sum(p.weight for p in self.pieces)


def auto_shard_bytes(inputs: Sequence[InputFile]) -> int:
    """The shard size of a run that names none: the inputs' total bytes over
    ``AUTO_SHARDS``, at least 1 MiB (a smaller shard costs a worker more to start than to
    write) and at most 256 MiB. It depends on the inputs only, never on the number of
    workers, so the output stays the same bytes whatever runs it; compressed files are
    never split, so each is one shard at least."""
    low, high = AUTO_SHARD_BYTES
    return min(high, max(low, -(-sum(f.size for f in inputs) // AUTO_SHARDS)))


def plan_units(inputs: Sequence[InputFile], shard_bytes: int) -> list[Unit]:
    """Group the inputs' pieces, in input order, into units of about ``shard_bytes``."""
    units: list[Unit] = []
    group: list[Piece] = []
    weight = 0
    for index, file in enumerate(inputs):
        for piece in split_input(index, file, shard_bytes):
            if group and weight + piece.weight > shard_bytes:
                units.append(Unit(len(units), tuple(group)))
                group, weight = [], 0
            group.append(piece)
            weight += piece.weight
    if group:
        units.append(Unit(len(units), tuple(group)))
    return units


def select_units(units: Sequence[Unit], num_shards: int, shard_id: int) -> list[Unit]:
    """This task's units when the work is spread over ``num_shards`` tasks (every K-th)."""
    if num_shards < 1:
        raise ConfigError(f"num_shards must be at least 1, got {num_shards!r}")
    if not 0 <= shard_id < num_shards:
        raise ConfigError(f"shard_id must be in [0, {num_shards}), got {shard_id!r}")
    return [u for u in units if u.index % num_shards == shard_id]


def plan_document(
    spec: TokenizeSpec, inputs: Sequence[InputFile], units: Sequence[Unit], tokenizer_sha: str
) -> dict:
    """The plan as plain data: stored beside the output so that a rerun (or another SLURM
    task) with different inputs or settings is refused instead of mixing outputs."""
    settings = dataclasses.asdict(spec)
    del settings["output_dir"], settings["strict"]
    if spec.output_format not in EOS_FORMATS:
        del settings["eos_token"]  # plans of the other formats stay as they were
    settings["tokenizer"] = tokenizer_sha
    files = [{"path": f.path, "bytes": f.size, "mtime_ns": _mtime(f.path)} for f in inputs]
    body = {"settings": settings, "inputs": files, "units": len(units)}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {**body, "fingerprint": digest}


def _mtime(path: str) -> int:
    return os.stat(path).st_mtime_ns
