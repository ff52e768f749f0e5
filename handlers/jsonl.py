"""JSON lines of text (plain, ``.gz`` or ``.zst``), tokenized while loading.

Each line is a JSON object; its ``text_field`` (``text``, ``raw_content``, ...) is a
document. The file is tokenized once into fmsdata's token cache (``TokenCache``) and read
from there as memory-mapped tokens. Lines that do not parse or lack the field are skipped
and counted (a warning names the file and the count); with ``strict`` the first one is an
error naming the file and line. A compressed file cut short keeps its whole documents
before the cut (a warning names the file and the count kept); with ``strict`` it is an
error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.compressed import CorruptStreamError, open_binary, read_lines
from fmsdata.handlers.derived import default_cache_dir
from fmsdata.handlers.text import (
    CachedTokens,
    CachedTokensHandler,
    TextTokenizer,
    TokenCache,
    TokenChunk,
    encode_texts,
)

__all__ = ["JsonlHandler", "open_binary", "decode_text", "parse_record"]

logger = logging.getLogger(__name__)

TEXTS_PER_BATCH = 512  # texts per encode_batch call


def decode_text(raw: bytes) -> tuple[str | None, str | None]:
    """``(text, None)``, or ``(None, problem)`` when ``raw`` is not UTF-8."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 ({err.reason} at byte {err.start})"


def parse_record(raw: bytes, text_field: str) -> tuple[str | None, str | None]:
    """One JSON line: ``(text, None)``, or ``(None, problem)`` when it holds no document."""
    line, problem = decode_text(raw)
    if line is None:
        return None, problem
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        # json's messages that end in "at" ("Invalid control character at") want the
        # position to be a sentence; a record is one line, so the column says where.
        detail = f"{err.msg} column {err.colno}" if err.msg.endswith(" at") else err.msg
        return None, f"invalid JSON ({detail})"
    if not isinstance(record, dict):
        return None, f"not a JSON object ({type(record).__name__})"
    if text_field not in record:
        keys = sorted(map(str, record))
        shown = ", ".join(map(repr, keys[:8])) + (", ..." if len(keys) > 8 else "")
        return None, f"no field {text_field!r} (the record holds {shown or 'no fields'})"
    text = record[text_field]
    if not isinstance(text, str):
        return None, f"field {text_field!r} is {type(text).__name__}, not text"
    return text, None


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
        """The documents of a file in order; None for a skipped malformed line.

        A compressed file cut short or damaged ends the records with a
        ``CorruptStreamError``, after every whole line before the damage.
        """
        for number, raw in enumerate(read_lines(path), start=1):
            if not raw.strip():
                continue
            text, problem = parse_record(raw, self.text_field)
            if problem is None:
                yield text
            elif self.strict:
                raise ShardFormatError(f"{path}:{number}: {problem}")
            else:
                yield None

    def chunks(self, path: str) -> Iterator[TokenChunk]:
        """The file's documents, tokenized in batches. A compressed file cut short or
        damaged is a ``ShardFormatError`` under ``strict``; else its whole documents before
        the damage are kept and the last chunk says what was lost (``damage``)."""
        batch: list[str | None] = []
        try:
            for text in self.records(path):
                batch.append(text)
                if len(batch) == TEXTS_PER_BATCH:
                    yield encode_texts(self.tokenizer, batch)
                    batch = []
        except CorruptStreamError as err:
            if self.strict:
                raise
            yield encode_texts(self.tokenizer, batch)._replace(damage=str(err))
            return
        yield encode_texts(self.tokenizer, batch)

    def open(self, path: str) -> CachedTokens:
        cache = TokenCache(self.cache_dir, "text", self.tokenizer.digest, self.text_field)
        try:
            reader = cache.load(path, lambda: self.chunks(path), self.tokenizer.dtype)
        except (OSError, EOFError, UnicodeDecodeError) as err:
            raise ShardFormatError(f"{path}: unreadable text shard ({err})") from None
        damage = reader.meta.get("damage")
        if damage:
            logger.warning(
                "%s: kept the %d whole document(s) before it, the rest of the file is lost "
                "(set strict to fail on a damaged file)",
                damage,
                reader.meta["documents"],
            )
        self.warn_skipped(reader, "malformed line(s)")
        return reader

    def describe(self) -> dict[str, Any]:
        return {
            "file_type": self.name,
            "tokenizer": self.tokenizer.digest,
            "text_field": self.text_field,
        }
