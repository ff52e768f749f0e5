"""Parquet shards: a pre-tokenized ``list<int>`` column, or a text column tokenized while
loading (``encode_batch`` per row group).

Documents are rows. Parquet pages are compressed and cannot be read at a row, and the
pipeline visits a file's documents in shuffled order, so a file's column is decoded (or
tokenized) once, row group by row group, into the token cache and memory mapped from
there: every later read is a view, in any worker or run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.base import column_candidates
from fmsdata.handlers.derived import default_cache_dir
from fmsdata.handlers.text import (
    CachedTokens,
    CachedTokensHandler,
    TextTokenizer,
    TokenCache,
    TokenChunk,
    encode_texts,
)

__all__ = ["ParquetHandler"]

TEXT_COLUMNS = ("text", "contents", "raw_content")


def _is_text(kind: Any) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _column_by_row_group(path: str, column: str) -> Iterator[tuple[int, Any]]:
    """``(row group, its column as one Arrow array)`` for each row group in order."""
    try:
        file = pq.ParquetFile(path, memory_map=True)
    except (pa.ArrowException, OSError) as err:
        raise ShardFormatError(f"{path}: not a readable Parquet file ({err})") from None
    meta = file.metadata
    rows = [meta.row_group(g).num_rows for g in range(file.num_row_groups)]
    if sum(rows) != meta.num_rows:  # the footer records row counts twice: damage if they differ
        raise ShardFormatError(
            f"{path}: footer says {meta.num_rows} rows, its row groups hold {sum(rows)}"
        )
    for g in range(file.num_row_groups):
        try:
            data = file.read_row_group(g, columns=[column]).column(0).combine_chunks()
        except (pa.ArrowException, OSError) as err:
            raise ShardFormatError(f"{path}: row group {g} is unreadable ({err})") from None
        if len(data) != rows[g]:
            raise ShardFormatError(
                f"{path}: row group {g} reads as {len(data)} rows, the footer says {rows[g]}"
            )
        yield g, data


def token_chunks(path: str, column: str) -> Iterator[TokenChunk]:
    """The documents of a ``list<int>`` column, one chunk per row group."""
    for g, data in _column_by_row_group(path, column):
        if data.null_count or data.values.null_count:
            raise ShardFormatError(f"{path}: row group {g} holds null documents or token ids")
        offsets = data.offsets.to_numpy().astype(np.int64)
        values = data.values.to_numpy(zero_copy_only=False)
        yield TokenChunk(values[offsets[0] : offsets[-1]], np.diff(offsets))


def text_chunks(
    path: str, column: str, tokenizer: TextTokenizer, strict: bool
) -> Iterator[TokenChunk]:
    """The documents of a text column, tokenized with one ``encode_batch`` per row group.
    A row without text is skipped and counted, or an error under ``strict``."""
    row = 0
    for _, data in _column_by_row_group(path, column):
        texts = data.to_pylist()
        if strict:
            for k, text in enumerate(texts):
                if not isinstance(text, str):
                    raise ShardFormatError(f"{path}: row {row + k} has no text in {column!r}")
        row += len(texts)
        yield encode_texts(tokenizer, texts)


_TAIL = 64 << 10  # first guess of a footer's size, read from the end of a file


class ParquetHandler(CachedTokensHandler):
    """Parquet, one document per row.

    Args:
        col_name: The document column, or a comma list of candidates of which each file
            uses the first it has: a ``list<int>`` column is read as token ids, a text
            column is tokenized with ``tokenizer``.
        text_field: Text column, tokenized with ``tokenizer`` when the file has none of
            ``col_name`` (``text``, ``contents`` and ``raw_content`` are tried too).
        tokenizer: Path of a ``tokenizer.json``, for text columns.
        strict: A row without text is an error instead of a skipped (counted) record.
        cache_dir: Root of the token cache.
    """

    name = "parquet"
    extensions = (".parquet",)

    def __init__(
        self,
        col_name: str = "tokens",
        text_field: str = "text",
        tokenizer: str | None = None,
        strict: bool = False,
        cache_dir: str | None = None,
    ):
        self.col_name = col_name
        self.text_field = text_field
        self.tokenizer = TextTokenizer(tokenizer) if tokenizer else None
        self.strict = strict
        self.cache_dir = cache_dir or default_cache_dir()

    def count_metadata(
        self, read: Callable[[str, int, int], bytes], path: str, size: int, tokens: bool
    ) -> tuple[int, int] | None:
        """The footer's row count (documents) of a file whose document column holds token
        lists (a text column: rows without text may be skipped, tokens need the text)."""
        if tokens:
            return None
        tail = read(path, max(0, size - _TAIL), size)
        if len(tail) < 8 or tail[-4:] != b"PAR1":
            return None
        need = int(np.frombuffer(tail[-8:-4], "<u4")[0]) + 8
        if need > len(tail):
            tail = read(path, max(0, size - need), size)
        try:
            meta = pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-need:]))
        except (pa.ArrowException, OSError):
            return None
        schema = meta.schema.to_arrow_schema()
        for name in column_candidates(self.col_name):
            if name in schema.names:
                kind = schema.field(name).type
                if pa.types.is_list(kind) or pa.types.is_large_list(kind):
                    return int(meta.num_rows), -1
                return None
        return None

    def open(self, path: str) -> CachedTokens:
        try:
            schema = pq.read_schema(path, memory_map=True)
        except (pa.ArrowException, OSError) as err:
            raise ShardFormatError(f"{path}: not a readable Parquet file ({err})") from None
        named = [c for c in column_candidates(self.col_name) if c in schema.names]
        if named:
            # col_name's first column present decides: token ids are read, text is tokenized.
            column = named[0]
            kind = schema.field(column).type
            if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(
                kind.value_type
            ):
                cache = TokenCache(self.cache_dir, "parquet", column)
                dtype = kind.value_type.to_pandas_dtype()
                return cache.load(path, lambda: token_chunks(path, column), dtype)
            if not _is_text(kind):
                raise ShardFormatError(
                    f"{path}: column {column!r} has type {kind}, not a list of token ids or text"
                )
            return self._open_text(path, column, self._need_tokenizer(path, column))
        for name in (self.text_field, *TEXT_COLUMNS):
            if name in schema.names and _is_text(schema.field(name).type):
                return self._open_text(path, name, self._need_tokenizer(path, name))
        raise ShardFormatError(
            f"{path}: no token column {self.col_name!r} and no text column "
            f"{[self.text_field, *TEXT_COLUMNS]}; columns are {schema.names}"
        )

    def _need_tokenizer(self, path: str, column: str) -> TextTokenizer:
        if self.tokenizer is None:
            raise ConfigError(f"{path}: has text column {column!r}: set tokenizer to tokenize it")
        return self.tokenizer

    def _open_text(self, path: str, column: str, tokenizer: TextTokenizer) -> CachedTokens:
        cache = TokenCache(self.cache_dir, "text", tokenizer.digest, column)
        reader = cache.load(
            path, lambda: text_chunks(path, column, tokenizer, self.strict), tokenizer.dtype
        )
        self.warn_skipped(reader, "row(s) without text")
        return reader

    def describe(self) -> dict[str, Any]:
        text = (
            {"tokenizer": self.tokenizer.digest, "text_field": self.text_field}
            if self.tokenizer
            else {}
        )
        return {"file_type": self.name, "col_name": self.col_name, **text}
