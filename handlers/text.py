"""Shards read through a token cache: text tokenized while loading, columns decoded.

A text file (or a compressed column) cannot be read at document ``i`` without parsing it,
so such a shard is turned once, in full, into flat tokens and a document index under
``<cache_dir>/<kind>/``, keyed by the file (path, size, mtime) and what the tokens depend on
(tokenizer, field). Later opens, in any worker or run, map the cache; a cache is only ever
seen complete (written to temporary names, its metadata renamed into place last).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.base import FlatBuffer, FlatBufferHandler
from fmsdata.handlers.derived import derived_path
from fmsdata.handlers.mapping import MappedFile
from fmsdata.handlers.npy_header import load_npy
from fmsdata.util.textcorpus import BUNDLED_TOKENIZERS, TOKENIZER_HINT, resolve_tokenizer
from fmsdata.util.urls import local_path

__all__ = [
    "TextTokenizer",
    "TokenChunk",
    "TokenCache",
    "CachedTokens",
    "CachedTokensHandler",
    "encode_texts",
]

logger = logging.getLogger(__name__)


class TextTokenizer:
    """A ``tokenizers`` tokenizer by file path, loaded lazily in each process.

    Args:
        path: A ``tokenizer.json``, or the name of a bundled one (``stdlib-bpe-4k``).
    """

    def __init__(self, path: str):
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"tokenizer {path!r} is not a file (a tokenizers tokenizer.json)")
        path = resolve_tokenizer(local_path(path, "tokenizer", TOKENIZER_HINT))
        if not os.path.isfile(path):
            raise ConfigError(
                f"tokenizer {path!r} is not a file (a tokenizers tokenizer.json, or the name of "
                f"a bundled one: {', '.join(BUNDLED_TOKENIZERS)})"
            )
        self.path = path
        with open(path, "rb") as handle:
            self.digest = hashlib.blake2b(handle.read(), digest_size=12).hexdigest()
        self._tokenizer: Any = None
        self.tokenizer  # noqa: B018  (load once here: a wrong file is a config error, now)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokenizer": None}

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            try:
                self._tokenizer = Tokenizer.from_file(self.path)
            except Exception as err:  # tokenizers raises bare Exception ("did not contain ...")
                raise ConfigError(
                    f"tokenizer {self.path!r} is not a tokenizers tokenizer.json ({err})"
                ) from None
        return self._tokenizer

    @property
    def dtype(self) -> np.dtype:
        """The narrowest unsigned type that holds every token id."""
        return np.dtype(np.uint16 if self.tokenizer.get_vocab_size() <= 1 << 16 else np.uint32)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens (the loader adds BOS/EOS)."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


class TokenChunk(NamedTuple):
    """Consecutive documents of a shard: their tokens back to back and their lengths."""

    tokens: np.ndarray
    lengths: np.ndarray
    skipped: int = 0  # malformed records dropped before these documents
    damage: str | None = None  # what ended the shard early (a cut stream): the rest is lost


def encode_texts(tokenizer: TextTokenizer, texts: list[str | None]) -> TokenChunk:
    """One ``encode_batch`` over ``texts``; None entries are skipped and counted."""
    kept = [t for t in texts if t is not None]
    ids = tokenizer.encode(kept) if kept else []
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    dtype = tokenizer.dtype
    tokens = (
        np.concatenate([np.asarray(i, dtype=dtype) for i in ids]) if ids else np.zeros(0, dtype)
    )
    return TokenChunk(tokens, lengths, len(texts) - len(kept))


class TokenCache:
    """Shards turned into flat tokens + document offsets once, then memory mapped.

    For formats that cannot be read at document ``i`` in place: text (tokenized) and
    compressed columns (decoded). The cache key is the source file (path, size, mtime) and
    ``key`` (tokenizer digest, field, ...).

    Args:
        cache_dir: Root of fmsdata's derived files.
        kind: Sub-folder (``text``, ``parquet``, ...).
        key: What else the derived tokens depend on.
    """

    def __init__(self, cache_dir: str, kind: str, *key: object):
        self.cache_dir = cache_dir
        self.kind = kind
        self.key = key

    def load(
        self, path: str, chunks: Callable[[], Iterator[TokenChunk]], dtype: np.dtype
    ) -> CachedTokens:
        """The cached tokens of ``path``, deriving them from ``chunks()`` on a miss.

        Args:
            path: The source shard.
            chunks: Yields the shard's documents in order, in chunks; raises
                ShardFormatError for a record it must not skip.
            dtype: Token type stored.
        """
        stem = derived_path(self.cache_dir, self.kind, path, *self.key)
        if not os.path.exists(stem + ".json"):
            os.makedirs(os.path.dirname(stem), exist_ok=True)
            self._build(stem, chunks, np.dtype(dtype))
        with open(stem + ".json") as handle:
            meta = json.load(handle)
        offsets = load_npy(stem + ".offsets.npy")
        return CachedTokens(path, stem + ".tokens", offsets, np.dtype(meta["dtype"]), meta)

    @staticmethod
    def _build(stem: str, chunks: Callable[[], Iterator[TokenChunk]], dtype: np.dtype) -> None:
        suffix = f".tmp{os.getpid()}"
        lengths: list[np.ndarray] = []
        skipped = 0
        damage = None
        try:
            with open(stem + ".tokens" + suffix, "wb") as out:
                for chunk in chunks():
                    out.write(np.ascontiguousarray(chunk.tokens, dtype=dtype).tobytes())
                    lengths.append(np.asarray(chunk.lengths, dtype=np.int64))
                    skipped += chunk.skipped
                    damage = chunk.damage or damage
        except BaseException:  # a bad record under strict, a cut stream: leave nothing behind
            os.unlink(stem + ".tokens" + suffix)
            raise
        every = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        offsets = np.zeros(len(every) + 1, dtype=np.int64)
        np.cumsum(every, out=offsets[1:])
        with open(stem + ".offsets.npy" + suffix, "wb") as out:
            np.save(out, offsets, allow_pickle=False)
        meta = {
            "dtype": dtype.name,
            "documents": len(every),
            "tokens": int(offsets[-1]),
            "skipped_records": skipped,
            "damage": damage,
        }
        with open(stem + ".json" + suffix, "w") as out:
            json.dump(meta, out)
        os.replace(stem + ".tokens" + suffix, stem + ".tokens")
        os.replace(stem + ".offsets.npy" + suffix, stem + ".offsets.npy")
        os.replace(stem + ".json" + suffix, stem + ".json")  # last: the cache is complete


class CachedTokens(FlatBuffer):
    """An open cache entry: the mapped tokens and where each document starts."""

    def __init__(
        self, path: str, tokens_path: str, offsets: np.ndarray, dtype: np.dtype, meta: dict
    ):
        self.meta = meta
        mapped = MappedFile(tokens_path) if offsets[-1] else None
        tokens = (
            mapped.view(dtype, count=int(offsets[-1]))
            if mapped is not None
            else np.zeros(0, dtype=dtype)
        )
        if len(tokens) != int(offsets[-1]):
            raise ShardFormatError(f"{path}: its token cache {tokens_path} is truncated")
        super().__init__(path, tokens, offsets[:-1], np.diff(offsets), [mapped])


class CachedTokensHandler(FlatBufferHandler):
    """Random access over shards read through a ``TokenCache`` (``open`` returns
    ``CachedTokens``, a ``FlatBuffer``): the rest of the handler contract comes with it."""

    def damage(self, reader: CachedTokens) -> str | None:
        return reader.meta.get("damage") or None

    @staticmethod
    def warn_skipped(reader: CachedTokens, records: str) -> None:
        """Log how many ``records`` (``"malformed line(s)"``) a lenient read skipped."""
        if reader.meta["skipped_records"]:
            skipped = reader.meta["skipped_records"]
            logger.warning(
                "%s: skipped %d %s (set strict to fail on them)", reader.path, skipped, records
            )
