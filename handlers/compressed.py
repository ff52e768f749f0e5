"""Byte streams over plain, gzip and zstandard files that never end early without a word.

Python's ``gzip`` raises ``EOFError``/``zlib.error``/``BadGzipFile`` with no file name, and
``zstandard``'s stream reader ends quietly at the end of a cut file, so a truncated
``.jsonl.zst`` would read as fewer documents. Here a cut, a corrupt stream or an empty
compressed file raises ``CorruptStreamError`` (a ``ShardFormatError``) naming the file,
from the ``read`` that meets it: callers keep what they read before it.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

from fmsdata.errors import ShardFormatError
from fmsdata.util.extras import require

__all__ = ["CorruptStreamError", "open_binary", "read_lines", "zstd_blocks"]

_BLOCK = 1 << 20


class CorruptStreamError(ShardFormatError):
    """A compressed file is cut short or damaged; the message names the file."""


def open_binary(path: str) -> BinaryIO:
    """A byte stream over a plain, gzip or zstandard file (by ending).

    Reading a damaged compressed file raises ``CorruptStreamError`` naming it.
    """
    name = path.lower()
    if name.endswith(".gz"):
        return io.BufferedReader(_Blocks(_gzip_blocks(path)), _BLOCK)  # type: ignore[return-value]
    if name.endswith((".zst", ".zstd")):
        return io.BufferedReader(_Blocks(zstd_blocks(path)), _BLOCK)  # type: ignore[return-value]
    return open(path, "rb")


def read_lines(path: str) -> Iterator[bytes]:
    """The lines of a plain, gzip or zstandard file (by ending), each with its newline
    (the last one may lack it).

    Every whole line decompressed before a cut or damage is given before the
    ``CorruptStreamError`` that ends the iteration; the line the damage cut is not.
    (Iterating ``open_binary`` instead gives none of a short file's lines: its buffered
    reader meets the error while filling its first buffer.)
    """
    name = path.lower()
    if name.endswith(".gz"):
        blocks = _gzip_blocks(path)
    elif name.endswith((".zst", ".zstd")):
        blocks = zstd_blocks(path)
    else:
        blocks = _plain_blocks(path)
    pending: list[bytes] = []  # pieces of a line that spans blocks
    for block in blocks:
        lines = block.split(b"\n")
        if len(lines) == 1:
            pending.append(block)
            continue
        yield b"".join([*pending, lines[0], b"\n"])
        for line in lines[1:-1]:
            yield line + b"\n"
        pending = [lines[-1]] if lines[-1] else []
    if pending:
        yield b"".join(pending)


def _plain_blocks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as raw:
        while block := raw.read(_BLOCK):
            yield block


class _Blocks(io.RawIOBase):
    """A raw stream over decompressed blocks (which raise ``CorruptStreamError``)."""

    def __init__(self, blocks: Iterator[bytes]):
        self._blocks = blocks
        self._pending = b""
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending and not self._done:
            try:
                self._pending = next(self._blocks)
            except StopIteration:
                self._done = True
            except CorruptStreamError:
                self._done = True
                raise
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        closer = getattr(self._blocks, "close", None)
        if closer is not None:
            closer()
        super().close()


def _empty(path: str, kind: str) -> CorruptStreamError:
    return CorruptStreamError(f"{path}: empty file, not a {kind} stream (cut or never written?)")


def _gzip_blocks(path: str) -> Iterator[bytes]:
    if os.path.getsize(path) == 0:
        raise _empty(path, "gzip")
    with gzip.open(path, "rb") as stream:
        while True:
            try:  # EOFError: the last member is cut short
                # read1: what is decompressed so far comes before the error (read would
                # raise before returning a cut file's readable part)
                block = stream.read1(_BLOCK)
            except (OSError, EOFError, zlib.error) as err:
                raise CorruptStreamError(
                    f"{path}: corrupt or truncated gzip stream ({err})"
                ) from None
            if not block:
                return
            yield block


def zstd_blocks(path: str) -> Iterator[bytes]:
    """The decompressed blocks of a zstd file; ``CorruptStreamError`` if cut or damaged."""
    zstandard = require("zstandard", f"reading {path} (zstd-compressed)")
    if os.path.getsize(path) == 0:
        raise _empty(path, "zstd")
    decompressor = zstandard.ZstdDecompressor()
    frame = decompressor.decompressobj()
    fed = False  # whether the current frame has received input
    with open(path, "rb") as raw:
        while data := raw.read(_BLOCK):
            while data:
                fed = True
                try:
                    out = frame.decompress(data)
                except zstandard.ZstdError as err:
                    raise CorruptStreamError(f"{path}: corrupt zstd stream ({err})") from None
                if out:
                    yield out
                if not frame.eof:
                    break
                data = frame.unused_data  # the next frame of a multi-frame file
                frame = decompressor.decompressobj()
                fed = False
    if fed and not frame.eof:
        raise CorruptStreamError(f"{path}: truncated zstd stream (the last frame is cut short)")
