"""Flat token streams: headerless arrays of token ids (OLMo / Dolma ``.npy``, ``.bin``,
datatrove ``.ds``), documents ending with a separator token (the EOS).

The type comes from ``token_dtype`` or a ``<file>.json`` sidecar (``{"dtype": "uint16"}``).
Document ends are found by scanning for the separator once per file; the result is cached
under ``<cache_dir>/flat/``. Writers that pre-allocate files can leave a zero-filled tail
after the last document: it is detected and never served as tokens (a warning says how
long it is).

Files written by ``np.save`` (they start with the ``\x93NUMPY`` magic) are read through
their header: its dtype is the token type (a conflicting ``token_dtype`` is an error), the
data starts after it, and a size that disagrees with its shape is a truncation. Files
without the magic are headerless, whatever their extension.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from fmsdata.errors import ConfigError, ShardFormatError
from fmsdata.handlers.base import FlatBuffer, FlatBufferHandler
from fmsdata.handlers.derived import default_cache_dir, derived_path
from fmsdata.handlers.mapping import MappedFile
from fmsdata.handlers.npy_header import (
    damaged_npy_prefix,
    has_npy_magic,
    load_npy,
    parse_npy_header,
)

__all__ = ["FlatTokensHandler"]

logger = logging.getLogger(__name__)

_SCAN = 1 << 24  # tokens compared per step while looking for separators


def _open_flat(
    path: str, dtype: np.dtype | None, separator: int, cache_dir: str, source: str
) -> FlatBuffer:
    mapped = MappedFile(path)
    dtype, offset = _layout(mapped.bytes, path, dtype, source)
    partial = (len(mapped.bytes) - offset) % dtype.itemsize
    if partial:
        # A stream of whole tokens that ends part-way into one was cut short; a wrong,
        # wider token_dtype can also leave a remainder, so its source is named too.
        whole = (len(mapped.bytes) - offset) // dtype.itemsize
        raise ShardFormatError(
            f"{path}: truncated: it has {len(mapped.bytes):,} bytes, {whole:,} whole "
            f"{dtype.name} tokens and {partial} byte(s) of a cut one (the token type is "
            f"{dtype.name} by {source or 'the file header'})"
        )
    flat = mapped.view(dtype, offset=offset)
    ends, tail = _document_ends(flat, separator, path, cache_dir)
    if tail:
        logger.warning(
            "%s: ignoring a zero-filled tail of %d tokens after the last document", path, tail
        )
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64) if len(ends) else ends
    return FlatBuffer(path, flat, starts, ends - starts, [mapped])


def _layout(
    raw: np.ndarray, path: str, configured: np.dtype | None, source: str
) -> tuple[np.dtype, int]:
    """Token type and data offset: from a NumPy header when the file has one, else the
    configured type (``source`` says where it came from) and offset 0."""
    if not has_npy_magic(raw):
        if damaged_npy_prefix(raw):
            raise ShardFormatError(f"{path}: damaged or cut .npy header (the magic is wrong)")
        if configured is None:
            raise ConfigError(f"{path}: set token_dtype (or write {path}.json with a 'dtype')")
        return configured, 0
    header = parse_npy_header(raw, path)
    if header.dtype.kind not in "ui":
        raise ShardFormatError(
            f"{path}: .npy header says dtype {header.dtype.str}, not an integer token type"
        )
    if header.fortran_order and len(header.shape) > 1:
        raise ShardFormatError(
            f"{path}: .npy array of shape {header.shape} is in Fortran order; a token stream "
            "must be C-ordered"
        )
    if configured is not None and (configured.kind, configured.itemsize) != (
        header.dtype.kind,
        header.dtype.itemsize,
    ):
        raise ConfigError(
            f"{path}: {source} is {configured.name} but the file's .npy header says "
            f"{header.dtype.name}; make them agree (the header is what np.save wrote)"
        )
    header.check_size(len(raw), path)
    return header.dtype, header.offset


def _document_ends(
    flat: np.ndarray, separator: int, path: str, cache_dir: str
) -> tuple[np.ndarray, int]:
    """Token offset after each document, and the length of a zero-filled tail (dropped)."""
    cache = derived_path(cache_dir, "flat", path, flat.dtype.name, separator)
    if os.path.exists(cache + ".json"):
        with open(cache + ".json") as handle:
            tail = int(json.load(handle)["zero_tail"])
        return load_npy(cache + ".npy"), tail
    found = [
        np.flatnonzero(flat[at : at + _SCAN] == separator) + at for at in range(0, len(flat), _SCAN)
    ]
    ends = (np.concatenate(found) + 1) if found else np.zeros(0, np.int64)
    last = int(ends[-1]) if len(ends) else 0
    rest = flat[last:]
    tail = 0
    if len(rest):
        if separator != 0 and not rest.any():
            tail = len(rest)  # pre-allocated and never written: not a document
        else:
            ends = np.append(ends, len(flat))  # a last document without its separator
    ends = ends.astype(np.int64)
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        partial = f"{cache}.tmp{os.getpid()}"
        with open(partial + ".npy", "wb") as out:
            np.save(out, ends, allow_pickle=False)
        with open(partial + ".json", "w") as out:
            json.dump({"zero_tail": tail, "source": os.path.abspath(path)}, out)
        os.replace(partial + ".npy", cache + ".npy")
        os.replace(partial + ".json", cache + ".json")
    except OSError as err:  # a read-only cache only costs a rescan next time
        logger.info("could not cache the document index of %s: %s", path, err)
    return ends, tail


class FlatTokensHandler(FlatBufferHandler):
    """Headerless token files split on a separator token.

    Args:
        token_dtype: Token type (else read from a ``<file>.json`` sidecar).
        separator: Token that ends each document (the EOS).
        cache_dir: Where document indexes are cached.
    """

    name = "npy"
    extensions = (".npy", ".bin", ".ds")
    documents_end_with_eos = True  # a document runs up to and including its separator
    described = ("token_dtype", "separator")

    def __init__(
        self,
        token_dtype: str | None = None,
        separator: int | None = None,
        cache_dir: str | None = None,
    ):
        if separator is None:
            raise ConfigError(
                "flat token files need doc_separator (or eos_token): the token ending documents"
            )
        self.token_dtype = token_dtype
        self.separator = separator
        self.cache_dir = cache_dir or default_cache_dir()

    def _dtype(self, path: str) -> tuple[np.dtype | None, str]:
        """The configured token type and where it came from (None: not configured)."""
        if self.token_dtype is not None:
            return np.dtype(self.token_dtype), "token_dtype"
        sidecar = path + ".json"
        if os.path.exists(sidecar):
            try:
                with open(sidecar) as handle:
                    return np.dtype(json.load(handle)["dtype"]), f"the 'dtype' of {sidecar}"
            except (ValueError, KeyError, TypeError) as err:
                raise ShardFormatError(f"{sidecar}: no readable 'dtype' ({err})") from None
        return None, ""

    def stream_layout(self, path: str) -> tuple[np.dtype, int]:
        """Token type and byte offset of the tokens in ``path``, without scanning it: what
        a direct memory map of the stream needs (map-style windows)."""
        mapped = MappedFile(path)
        try:
            dtype, source = self._dtype(path)
            return _layout(mapped.bytes, path, dtype, source)
        finally:
            mapped.close()

    def open(self, path: str) -> FlatBuffer:
        dtype, source = self._dtype(path)
        return _open_flat(path, dtype, self.separator, self.cache_dir, source)
