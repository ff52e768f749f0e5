"""JSON lines of text (plain, ``.gz`` or ``.zst``), tokenized while loading.

Each line is a JSON object; its ``text_field`` (``text``, ``raw_content``, ...) is a
document. The file is tokenized once into fmsdata's token cache (``TokenCache``) and read
from there as memory-mapped tokens. Lines that do not parse or lack the field are skipped
and counted (a warning names the file and the count); with ``strict`` the first one is an
error naming the file and line.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.derived import default_cache_dir
from fmsdata.handlers.text import (
    CachedTokens,
    CachedTokensHandler,
    TextTokenizer,
    TokenCache,
    TokenChunk,
    encode_texts,
)

__all__ = ["JsonlHandler", "open_text"]

logger = logging.getLogger(__name__)

TEXTS_PER_BATCH = 512  # texts per encode_batch call


def open_text(path: str) -> io.TextIOBase:
    """A text stream over a plain, gzip or zstandard file (by ending)."""
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    if path.endswith(".zst") or path.endswith(".zstd"):
        import zstandard

        raw = open(path, "rb")
        return io.TextIOWrapper(
            zstandard.ZstdDecompressor().stream_reader(raw, closefd=True), encoding="utf-8"
        )
    return open(path, encoding="utf-8")


class JsonlHandler(CachedTokensHandler):
    """JSON lines text shards.

    Args:
        tokenizer: Path of a ``tokenizer.json``.
        text_field: Field holding the document text.
        strict: Fail on the first malformed line instead of skipping it.
        cache_dir: Root of the token cache.
    """

    name = "jsonl"
    extensions = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst", ".jsonl.zstd")

    def __init__(
        self,
        tokenizer: str | None = None,
        text_field: str = "text",
        strict: bool = False,
        cache_dir: str | None = None,
    ):
        if tokenizer is None:
            raise ConfigError("file_type 'jsonl' reads text: set tokenizer to a tokenizer.json")
        self.tokenizer = TextTokenizer(tokenizer)
        self.text_field = text_field
        self.strict = strict
        self.cache_dir = cache_dir or default_cache_dir()

    def records(self, path: str) -> Iterator[str | None]:
        """The documents of a file in order; None for a skipped malformed line."""
        with open_text(path) as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    text = record.get(self.text_field) if isinstance(record, dict) else None
                    problem = (
                        None if isinstance(text, str) else f"no text field {self.text_field!r}"
                    )
                except json.JSONDecodeError as err:
                    problem = f"invalid JSON ({err.msg})"
                if problem is None:
                    yield text
                elif self.strict:
                    raise ShardFormatError(f"{path}:{number}: {problem}")
                else:
                    yield None

    def chunks(self, path: str) -> Iterator[TokenChunk]:
        batch: list[str | None] = []
        for text in self.records(path):
            batch.append(text)
            if len(batch) == TEXTS_PER_BATCH:
                yield encode_texts(self.tokenizer, batch)
                batch = []
        yield encode_texts(self.tokenizer, batch)

    def open(self, path: str) -> CachedTokens:
        cache = TokenCache(self.cache_dir, "text", self.tokenizer.digest, self.text_field)
        try:
            reader = cache.load(path, lambda: self.chunks(path), self.tokenizer.dtype)
        except (OSError, EOFError, UnicodeDecodeError) as err:
            raise ShardFormatError(f"{path}: unreadable text shard ({err})") from None
        if reader.meta["skipped_records"]:
            logger.warning(
                "%s: skipped %d malformed line(s) (set strict to fail on them)",
                path,
                reader.meta["skipped_records"],
            )
        return reader

    def describe(self) -> dict[str, Any]:
        return {
            "file_type": self.name,
            "tokenizer": self.tokenizer.digest,
            "text_field": self.text_field,
        }
