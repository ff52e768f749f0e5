"""MosaicML streaming (MDS) shards: ``index.json`` + ``shard.NNNNN.mds[.zstd]``.

A shard is ``uint32 n``, ``uint32[n + 1]`` sample offsets, a JSON config, then samples;
a sample holds, for each variable-size column in sorted name order, a ``uint32`` size,
then each column's bytes. The token column is ``bytes`` (raw tokens of ``token_dtype``)
or ``ndarray[:dtype[:shape]]``, or ``pkl`` holding a numpy integer array per sample (CEPE),
read by ``safe_pickle.read_int_array``, which rebuilds the array from the stored bytes and
refuses every other pickle without running it. Compressed shards
(``.zstd``) are decompressed once into fmsdata's cache.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable
from typing import Any

import numpy as np

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.base import MappedReaderHandler, pick_column
from fmsdata.handlers.compressed import zstd_blocks
from fmsdata.handlers.derived import default_cache_dir, derived_path
from fmsdata.handlers.mapping import MappedFile
from fmsdata.handlers.safe_pickle import read_int_array

__all__ = ["MdsHandler"]

_VALUE_DTYPES = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    32: "uint32",
    33: "int32",
    64: "uint64",
    65: "int64",
}
_COLUMN_KEYS = ("column_names", "column_encodings", "column_sizes")
_SHAPE_DTYPES = {0: np.uint8, 1: np.uint16, 2: np.uint32, 3: np.uint64}


def _check_entry(index: str, name: str, entry: dict[str, Any]) -> None:
    """The fields of a shard's index.json entry that the reader relies on, typed."""
    names, encodings, sizes = (entry.get(key) for key in _COLUMN_KEYS)
    lists = [names, encodings, sizes]
    if not all(isinstance(x, list) for x in lists) or len({len(x) for x in lists}) != 1:
        raise ShardFormatError(
            f"{index}: shard {name} needs lists {', '.join(_COLUMN_KEYS)} of one length, got "
            f"{names!r}, {encodings!r}, {sizes!r}"
        )
    if not all(isinstance(x, str) for x in names + encodings) or not all(
        x is None or (type(x) is int and x >= 0) for x in sizes
    ):
        raise ShardFormatError(
            f"{index}: shard {name} has malformed columns {names!r} {encodings!r} {sizes!r}"
        )
    samples = entry.get("samples")
    if samples is not None and (type(samples) is not int or samples < 0):
        raise ShardFormatError(f"{index}: shard {name} has samples {samples!r}")


def _shard_entry(path: str) -> dict[str, Any]:
    folder, name = os.path.split(path)
    index = os.path.join(folder, "index.json")
    try:
        with open(index) as handle:
            shards = json.load(handle)["shards"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ShardFormatError(f"{path}: no readable MDS index.json beside it ({err})") from None
    if not isinstance(shards, list) or not all(isinstance(e, dict) for e in shards):
        raise ShardFormatError(f"{index}: 'shards' is not a list of shard entries")
    for entry in shards:
        names = {
            part.get("basename")
            for part in (entry.get("raw_data"), entry.get("zip_data"))
            if isinstance(part, dict)
        }
        if name in names:
            if entry.get("format") != "mds":
                raise ShardFormatError(
                    f"{index}: shard {name} has format {entry.get('format')!r}, expected 'mds'"
                )
            _check_entry(index, name, entry)
            return entry
    raise ShardFormatError(f"{index}: lists no shard named {name}")


def _check_size(path: str, size: int, entry: Any, what: str) -> None:
    """Compare a shard's size with the ``bytes`` its index.json entry records (if any)."""
    expected = entry.get("bytes") if isinstance(entry, dict) else None
    if isinstance(expected, int) and size != expected:
        cut = "truncated" if size < expected else "longer than written"
        raise ShardFormatError(
            f"{path}: {cut}: {what}size {size} bytes, index.json records {expected}"
        )


class _MdsReader:
    def __init__(self, path: str, col_name: str, token_dtype: str | None, cache_dir: str):
        self.path = path
        entry = _shard_entry(path)
        names, encodings, sizes = (
            entry["column_names"],
            entry["column_encodings"],
            entry["column_sizes"],
        )
        col_name = pick_column(path, names, col_name)
        column = names.index(col_name)
        encoding = encodings[column]
        if encoding == "pkl":
            self.dtype, self.header = np.dtype("V"), "pkl"  # per sample, from the pickle
        elif encoding == "bytes":
            if token_dtype is None:
                raise ConfigError(f"{path}: column {col_name!r} holds raw bytes: set token_dtype")
            self.dtype, self.header = np.dtype(token_dtype), "none"
        elif encoding.startswith("ndarray"):
            parts = encoding.split(":")
            self.dtype = np.dtype(parts[1]) if len(parts) > 1 else np.dtype("V")  # per sample
            self.header = (
                "none" if len(parts) > 2 else ("shape" if len(parts) == 2 else "dtype+shape")
            )
        else:
            raise ShardFormatError(
                f"{path}: column {col_name!r} has encoding {encoding!r}, not token ids"
            )
        if path.endswith(".mds"):
            _check_size(path, os.path.getsize(path), entry.get("raw_data"), "")
            self.mapped = MappedFile(path)
        else:
            _check_size(path, os.path.getsize(path), entry.get("zip_data"), "")
            raw = self._decompressed(path, entry, cache_dir)
            _check_size(path, os.path.getsize(raw), entry.get("raw_data"), "decompressed ")
            self.mapped = MappedFile(raw)
        data = self.mapped.bytes
        if len(data) < 4:
            raise ShardFormatError(f"{path}: truncated MDS shard ({len(data)} bytes)")
        n = int(data[:4].view(np.uint32)[0])
        if n != entry.get("samples", n) or 4 * (n + 2) > len(data):
            raise ShardFormatError(
                f"{path}: header says {n} samples, index.json {entry.get('samples')}, or truncated"
            )
        offsets = data[4 : 4 * (n + 2)].view(np.uint32).astype(np.int64)
        if offsets[0] < 4 * (n + 2):
            raise ShardFormatError(
                f"{path}: first sample offset {int(offsets[0])} points into the shard header"
            )
        if n and (np.any(np.diff(offsets) < 0) or offsets[-1] > len(data)):
            raise ShardFormatError(
                f"{path}: sample offsets decrease or run past the end "
                f"({int(offsets[-1])} > {len(data)})"
            )
        # Sizes of variable columns open each sample; fixed ones are in the index.
        variable = [k for k, size in enumerate(sizes) if not size]
        heads = offsets[:-1]
        size_of = {}
        for slot, k in enumerate(variable):
            at = heads + 4 * slot
            size_of[k] = (
                data[at[:, None] + np.arange(4)].view(np.uint32).reshape(-1).astype(np.int64)
                if n
                else np.zeros(0, np.int64)
            )
        start = heads + 4 * len(variable)
        for k in range(column):
            start = start + (size_of[k] if k in size_of else int(sizes[k]))
        length = (
            size_of[column] if column in size_of else np.full(n, int(sizes[column]), dtype=np.int64)
        )
        end = heads + 4 * len(variable)
        for k in range(len(names)):
            end = end + (size_of[k] if k in size_of else int(sizes[k]))
        if n and np.any(end != offsets[1:]):
            bad = int(np.argmax(end != offsets[1:]))
            raise ShardFormatError(
                f"{path}: sample {bad}'s columns take {int(end[bad] - heads[bad])} bytes, its "
                f"offsets give it {int(offsets[bad + 1] - offsets[bad])}"
            )
        self.starts, self.byte_lengths, self.n = start, length, n
        self.buffer = self._token_buffer()

    def _token_buffer(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(flat, starts, lengths)`` in tokens when the column has one dtype and every
        sample's tokens sit aligned in the file (None otherwise: read sample by sample)."""
        if self.header in ("dtype+shape", "pkl"):
            return None
        data = self.mapped.bytes
        first = self.starts
        if self.header == "shape" and self.n:
            if np.any(self.byte_lengths < 1):
                raise ShardFormatError(f"{self.path}: a sample's ndarray has no shape header")
            code = data[first].astype(np.int64)
            first = first + 1 + (code >> 2) * (1 << (code & 3))
        size = self.starts + self.byte_lengths - first
        itemsize = self.dtype.itemsize
        wrong = (size < 0) | (size % itemsize != 0)
        if np.any(wrong):
            raise ShardFormatError(
                f"{self.path}: sample {int(np.flatnonzero(wrong)[0])} token bytes are not "
                f"whole {self.dtype.name} values"
            )
        # Samples' tokens need not be aligned in the file (the JSON config before them has
        # any length), but when they all sit at one offset modulo the item size, one
        # (possibly unaligned) view of the file holds every document.
        shift = int(first[0] % itemsize) if self.n else 0
        if np.any(first % itemsize != shift):
            return None
        usable = (len(data) - shift) // itemsize * itemsize
        flat = data[shift : shift + usable].view(self.dtype)
        return flat, (first - shift) // itemsize, size // itemsize

    @staticmethod
    def _decompressed(path: str, entry: dict[str, Any], cache_dir: str) -> str:
        target = derived_path(cache_dir, "mds", path) + ".mds"
        if not os.path.exists(target):
            if (entry.get("compression") or "").split(":")[0] not in ("zstd",):
                raise ShardFormatError(
                    f"{path}: compression {entry.get('compression')!r} is not supported"
                )
            os.makedirs(os.path.dirname(target), exist_ok=True)
            partial = f"{target}.tmp{os.getpid()}"
            try:
                with open(partial, "wb") as out:
                    for block in zstd_blocks(path):  # a cut or corrupt stream names ``path``
                        out.write(block)
            except BaseException:
                os.unlink(partial)
                raise
            os.replace(partial, target)
        return target

    def doc(self, i: int) -> np.ndarray:
        if not 0 <= i < self.n:
            raise ShardFormatError(f"{self.path}: document {i} requested, the shard holds {self.n}")
        if self.buffer is not None:
            flat, starts, lengths = self.buffer
            return flat[int(starts[i]) : int(starts[i]) + int(lengths[i])]
        data = self.mapped.bytes
        at, size = int(self.starts[i]), int(self.byte_lengths[i])
        if self.header == "pkl":
            return read_int_array(data[at : at + size].data, f"{self.path} sample {i}")
        dtype = self.dtype
        end = at + size
        if self.header == "dtype+shape":
            dtype = np.dtype(_VALUE_DTYPES.get(int(data[at]), "V"))
            if dtype.kind not in "iu":
                raise ShardFormatError(
                    f"{self.path}: sample {i} stores dtype code {int(data[at])}, not integers"
                )
            at += 1
        if self.header in ("shape", "dtype+shape"):
            byte = int(data[at])
            ndim, shape_type = byte >> 2, _SHAPE_DTYPES[byte % 4]
            at += 1 + ndim * np.dtype(shape_type).itemsize
        if (end - at) % dtype.itemsize or at > end:
            raise ShardFormatError(
                f"{self.path}: sample {i} token bytes are not whole {dtype.name} values"
            )
        return np.frombuffer(
            self.mapped.bytes, dtype=dtype, count=(end - at) // dtype.itemsize, offset=at
        )


class MdsHandler(MappedReaderHandler):
    """MDS shards; the folder's ``index.json`` describes their columns.

    Args:
        col_name: The token column.
        token_dtype: Token type of a ``bytes`` column.
        cache_dir: Where ``.zstd`` shards are decompressed.
    """

    name = "mds"
    extensions = (".mds", ".mds.zstd")
    described = ("col_name", "token_dtype")

    def __init__(
        self, col_name: str = "tokens", token_dtype: str | None = None, cache_dir: str | None = None
    ):
        self.col_name = col_name
        self.token_dtype = token_dtype
        self.cache_dir = cache_dir or default_cache_dir()

    @classmethod
    def select(cls, paths: list[str]) -> list[str]:
        present = set(paths)
        return [
            p
            for p in paths
            if p.endswith(".mds") or (p.endswith(".mds.zstd") and p[: -len(".zstd")] not in present)
        ]

    @classmethod
    def companions(cls, path: str) -> list[str]:
        return [os.path.join(os.path.dirname(path), "index.json")]

    def open(self, path: str) -> _MdsReader:
        return _MdsReader(path, self.col_name, self.token_dtype, self.cache_dir)

    def count_metadata(
        self, read: Callable[[str, int, int], bytes], path: str, size: int, tokens: bool
    ) -> tuple[int, int] | None:
        """The folder's ``index.json`` lists each shard's samples (documents); tokens
        need the shards."""
        if tokens:
            return None
        index = posixpath.join(posixpath.dirname(path), "index.json")
        try:
            shards = json.loads(read(index, 0, -1))["shards"]
        except (KeyError, ValueError, TypeError):
            return None
        name = posixpath.basename(path)
        for shard in shards:
            names = {(shard.get(k) or {}).get("basename") for k in ("raw_data", "zip_data")}
            if name in names:
                return int(shard["samples"]), -1
        return None

    def doc_lengths(self, reader: _MdsReader, indices: np.ndarray) -> np.ndarray:
        if reader.buffer is not None:
            return reader.buffer[2][indices]
        return super().doc_lengths(reader, indices)

    def token_buffer(self, reader: _MdsReader) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        return reader.buffer
