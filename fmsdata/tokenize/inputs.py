"""Raw text inputs of ``fmsdata tokenize``: which files, how they split, their documents.

Three kinds of file are read: JSON lines (plain, ``.gz``, ``.zst``; a document per line in
a text field), Parquet (a document per row of a text column) and plain text (a whole file
is one document). A *piece* is a part of one file that can be tokenized on its own: a byte
range of a plain JSONL file (the lines that start inside it), a run of Parquet row groups,
or a whole compressed or text file. Pieces depend only on the files, so every process that
plans the same inputs cuts them the same way.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.jsonl import decode_text, open_binary, parse_record
from fmsdata.util.urls import local_path

__all__ = [
    "InputFile",
    "Piece",
    "find_inputs",
    "split_input",
    "read_piece",
    "describe_position",
]

JSONL_ENDINGS = (".jsonl", ".json", ".ndjson")
COMPRESSED = (".gz", ".zst", ".zstd")
TEXT_ENDINGS = (".txt", ".md", ".text")
PARQUET_ENDINGS = (".parquet",)
# Compressions tokenize does not read: an input under one of them is refused, never left
# out of a folder without a word.
UNREAD_COMPRESSIONS = (".bz2", ".xz", ".lzma", ".lz4", ".br", ".snappy", ".z", ".zip", ".7z")


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One input file: its path (as given or found), kind and size."""

    path: str
    kind: str  # "jsonl", "parquet" or "text"
    size: int
    compressed: bool


@dataclasses.dataclass(frozen=True)
class Piece:
    """A part of an input tokenized on its own: bytes ``[start, end)`` of a plain JSONL file
    (the lines starting there), row groups ``[start, end)`` of a Parquet file, or the whole
    file (``start == 0``, ``end`` = its size) otherwise. ``weight`` is its size in bytes."""

    file: int  # index into the input list
    start: int
    end: int
    weight: int


def kind_of(path: str) -> tuple[str, bool] | None:
    """``(kind, compressed)`` of a path by its ending, None when it is not an input."""
    name = path.lower()
    compressed = name.endswith(COMPRESSED)
    if compressed:
        name = name.rsplit(".", 1)[0]
    if name.endswith(JSONL_ENDINGS):
        return "jsonl", compressed
    if name.endswith(TEXT_ENDINGS):
        return "text", compressed
    if name.endswith(PARQUET_ENDINGS) and not compressed:
        return "parquet", False
    return None


def _unread_compression(path: str) -> ConfigError | None:
    """The error for an input (by its inner ending) under a compression not read here."""
    name = path.lower()
    if not name.endswith(UNREAD_COMPRESSIONS):
        return None
    inner, suffix = name.rsplit(".", 1)
    if not inner.endswith(JSONL_ENDINGS + TEXT_ENDINGS + PARQUET_ENDINGS):
        return None
    return ConfigError(
        f"{path}: input under .{suffix} compression, which tokenize does not read (it reads "
        f"{', '.join(COMPRESSED)}); decompress it or recompress it with zstd or gzip"
    )


def find_inputs(paths: Sequence[str]) -> list[InputFile]:
    """The input files named by ``paths`` (files, or folders searched recursively), sorted
    within each folder; a named file of unknown kind is an error, one found in a folder is
    left out, unless its name says it is an input under a compression not read here
    (``.jsonl.bz2``): then it is an error too, since leaving it out drops its documents."""
    found: list[InputFile] = []
    seen: set[str] = set()
    for given in paths:
        given = local_path(given, "input", "tokenize reads local files: copy them first")
        if os.path.isdir(given):
            names = sorted(
                os.path.join(folder, f) for folder, _, files in os.walk(given) for f in files
            )
            for path in names:
                unread = _unread_compression(path)
                if unread is not None:
                    raise unread
            candidates = [p for p in names if kind_of(p) is not None]
            if not candidates:
                raise ConfigError(f"input folder {given!r} holds no .jsonl, .parquet or .txt file")
        elif os.path.isfile(given):
            unread = _unread_compression(given)
            if unread is not None:
                raise unread
            if kind_of(given) is None:
                raise ConfigError(
                    f"input {given!r}: unknown kind of file (want .jsonl/.json[.gz|.zst], "
                    ".parquet or .txt[.gz|.zst])"
                )
            candidates = [given]
        else:
            raise ConfigError(f"input {given!r} does not exist")
        for path in candidates:
            key = os.path.realpath(path)
            if key in seen:
                continue
            seen.add(key)
            kind, compressed = kind_of(path)  # type: ignore[misc]
            found.append(InputFile(path, kind, os.path.getsize(path), compressed))
    return found


def split_input(index: int, file: InputFile, piece_bytes: int) -> list[Piece]:
    """Cut an input into pieces of about ``piece_bytes`` where its format allows."""
    if file.kind == "jsonl" and not file.compressed and file.size > piece_bytes:
        starts = range(0, file.size, piece_bytes)
        return [
            Piece(index, s, min(s + piece_bytes, file.size), min(piece_bytes, file.size - s))
            for s in starts
        ]
    if file.kind == "parquet":
        try:
            meta = pq.ParquetFile(file.path).metadata
        except (pa.ArrowInvalid, OSError) as err:
            raise ShardFormatError(f"{file.path}: not a readable Parquet file ({err})") from None
        pieces: list[Piece] = []
        first, weight = 0, 0
        for g in range(meta.num_row_groups):
            weight += meta.row_group(g).total_byte_size
            if weight >= piece_bytes or g == meta.num_row_groups - 1:
                pieces.append(Piece(index, first, g + 1, weight))
                first, weight = g + 1, 0
        return pieces or [Piece(index, 0, 0, 0)]
    return [Piece(index, 0, file.size, file.size)]


# A document, or why a record is not one: (position, text) or (position, None, problem).
Record = tuple[int, "str | None", "str | None"]


def read_piece(file: InputFile, piece: Piece, text_field: str) -> Iterator[Record]:
    """The records of a piece in order: ``(where, text, None)`` for a document and
    ``(where, None, problem)`` for a record that is not one. ``where`` is a byte offset
    (plain JSONL; see ``line_number``), a line number (compressed JSONL) or a row.

    Raises:
        ShardFormatError: The file cannot be read (corrupt compression, bad Parquet).
    """
    try:
        if file.kind == "parquet":
            yield from _parquet_records(file, piece, text_field)
        elif file.kind == "text":
            with open_binary(file.path) as handle:
                yield (0, *decode_text(handle.read()))
        elif file.compressed:
            with open_binary(file.path) as handle:
                for number, raw in enumerate(handle, start=1):
                    if raw.strip():
                        yield (number, *parse_record(raw, text_field))
        else:
            yield from _plain_jsonl_records(file, piece, text_field)
    except (OSError, EOFError) as err:
        raise ShardFormatError(f"{file.path}: unreadable input ({err})") from None


def _plain_jsonl_records(file: InputFile, piece: Piece, text_field: str) -> Iterator[Record]:
    with open(file.path, "rb") as handle:
        if piece.start > 0:
            handle.seek(piece.start - 1)
            handle.readline()  # the rest of a line begun in the piece before
        position = handle.tell()
        while position < piece.end:
            raw = handle.readline()
            if not raw:
                break
            if raw.strip():
                yield (position, *parse_record(raw, text_field))
            position += len(raw)


def _parquet_records(file: InputFile, piece: Piece, text_field: str) -> Iterator[Record]:
    try:
        parquet = pq.ParquetFile(file.path)
    except (pa.ArrowInvalid, OSError) as err:
        raise ShardFormatError(f"{file.path}: not a readable Parquet file ({err})") from None
    if text_field not in parquet.schema_arrow.names:
        raise ShardFormatError(
            f"{file.path}: no column {text_field!r} (columns: {parquet.schema_arrow.names})"
        )
    row = sum(parquet.metadata.row_group(g).num_rows for g in range(piece.start))
    for g in range(piece.start, piece.end):
        try:
            column = parquet.read_row_group(g, columns=[text_field]).column(0)
        except (pa.ArrowInvalid, OSError) as err:
            raise ShardFormatError(f"{file.path}: row group {g} is unreadable ({err})") from None
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise ShardFormatError(
                f"{file.path}: column {text_field!r} holds {column.type}, not text"
            )
        for text in column.to_pylist():
            if text is None:
                yield row, None, f"null {text_field!r}"
            else:
                yield row, text, None
            row += 1


def describe_position(file: InputFile, where: int) -> str:
    """``path:line`` (or ``path: row N``) of a record position from ``read_piece``."""
    if file.kind == "parquet":
        return f"{file.path}: row {where}"
    if file.kind == "text":
        return file.path
    if file.compressed:
        return f"{file.path}:{where}"
    return f"{file.path}:{line_number(file.path, where)}"


def line_number(path: str, offset: int) -> int:
    """The 1-based number of the line starting at byte ``offset`` of a file."""
    count = 0
    with open(path, "rb") as handle:
        remaining = offset
        while remaining > 0:
            block = handle.read(min(remaining, 1 << 24))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count + 1
