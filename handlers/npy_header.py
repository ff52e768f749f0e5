"""The header of files written by ``np.save`` (NumPy ``.npy`` format, versions 1 to 3).

A ``.npy`` file starts with the magic ``\\x93NUMPY``, a major and minor version, the
header's length (2 bytes little-endian in version 1, 4 bytes in versions 2 and 3) and the
header itself: a Python dict literal with ``descr``, ``fortran_order`` and ``shape``. The
data follows it. Files from other writers share the extension without the header (OLMo and
Dolma token streams are raw memory maps), so the magic, never the extension, tells the two
apart.

The header is parsed by a small strict parser of just what numpy writes there (a dict of
string keys whose values are strings, booleans, integers, tuples and lists), so no names,
calls or pickles are evaluated. It does not use ``ast``: ``ast.literal_eval`` in DataLoader
worker threads once raised an untyped ``SystemError: AST constructor recursion depth
mismatch`` (a CPython 3.11 race). The values are then checked strictly; object dtypes,
which ``np.load`` could only read by unpickling, are refused. Anything malformed is a
``ShardFormatError`` naming the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from fmsdata.errors import ShardFormatError

__all__ = [
    "NPY_MAGIC",
    "NpyHeader",
    "has_npy_magic",
    "damaged_npy_prefix",
    "load_npy",
    "npy_from_bytes",
    "parse_npy_header",
    "read_npy_header",
]

NPY_MAGIC = b"\x93NUMPY"
_MAX_HEADER = 1 << 20  # numpy writes a few hundred bytes; larger is damage, not a header
_KEYS = {"descr", "fortran_order", "shape"}


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header says about its array.

    Attributes:
        dtype: Element type (never an object dtype).
        shape: Array shape.
        fortran_order: Whether the data is stored column-major.
        offset: Byte offset of the first data byte.
    """

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    offset: int

    @property
    def count(self) -> int:
        """Number of elements the shape holds."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        """Bytes of data the header promises after ``offset``."""
        return self.count * self.dtype.itemsize

    def check_size(self, file_size: int, path: str) -> None:
        """Raise ``ShardFormatError`` unless the file holds exactly the promised data."""
        have = file_size - self.offset
        if have < self.nbytes:
            raise ShardFormatError(
                f"{path}: truncated .npy file: its header promises shape {self.shape} of "
                f"{self.dtype.str} ({self.nbytes} bytes of data), the file holds {have}"
            )
        if have > self.nbytes:
            raise ShardFormatError(
                f"{path}: .npy file has {have - self.nbytes} bytes after the {self.nbytes} "
                f"bytes of data its header (shape {self.shape}, {self.dtype.str}) promises"
            )


def has_npy_magic(raw: bytes | np.ndarray) -> bool:
    """Whether ``raw`` (the file's first bytes) starts with the ``.npy`` magic."""
    return len(raw) >= len(NPY_MAGIC) and bytes(raw[: len(NPY_MAGIC)]) == NPY_MAGIC


def damaged_npy_prefix(raw: bytes | np.ndarray) -> bool:
    """Whether a file without the magic still looks like a ``.npy`` file: it is a cut
    magic, or a header dict starts where a version 1 or 2 header would. Reading such a file
    as a headerless stream would serve its header as tokens."""
    start = bytes(raw[:32])
    if has_npy_magic(start):
        return False
    if len(start) < len(NPY_MAGIC) and NPY_MAGIC.startswith(start):
        return True
    return start[10:19] == b"{'descr':" or start[12:21] == b"{'descr':"


def read_npy_header(path: str) -> NpyHeader:
    """Parse the header of the ``.npy`` file at ``path`` (reads only the header)."""
    with open(path, "rb") as handle:
        start = handle.read(12)
        length = _header_length(start, path)
        raw = start + handle.read(max(0, length - len(start)))
    return parse_npy_header(raw, path)


def load_npy(path: str) -> np.ndarray:
    """The array of the ``.npy`` file at ``path``, read through ``read_npy_header``.

    ``np.load`` parses the header with ``ast.literal_eval``, which can raise an untyped
    ``SystemError`` in DataLoader workers (a CPython 3.11 race); fmsdata's own caches are
    read with this instead. A file whose size disagrees with its header is a
    ``ShardFormatError`` naming it.
    """
    header = read_npy_header(path)
    header.check_size(os.path.getsize(path), path)
    flat = np.fromfile(path, dtype=header.dtype, count=header.count, offset=header.offset)
    return flat.reshape(header.shape, order="F" if header.fortran_order else "C")


def npy_from_bytes(raw: bytes, path: str) -> np.ndarray:
    """The array of a whole ``.npy`` file held in ``raw`` (a copy, writable), parsed as
    ``load_npy`` parses files; ``path`` names it in errors."""
    header = parse_npy_header(raw, path)
    header.check_size(len(raw), path)
    flat = np.frombuffer(raw, dtype=header.dtype, count=header.count, offset=header.offset)
    return flat.reshape(header.shape, order="F" if header.fortran_order else "C").copy()


def _header_length(raw: bytes, path: str) -> int:
    """Bytes from the file's start to the end of the header, from the fixed prefix."""
    if not has_npy_magic(raw):
        raise ShardFormatError(f"{path}: not a .npy file (no \\x93NUMPY magic)")
    if len(raw) < 8:
        raise ShardFormatError(f"{path}: truncated .npy header ({len(raw)} bytes)")
    major, minor = raw[6], raw[7]
    if major not in (1, 2, 3) or minor != 0:
        raise ShardFormatError(
            f"{path}: .npy format version {major}.{minor} is not 1.0, 2.0 or 3.0"
        )
    prefix = 10 if major == 1 else 12
    if len(raw) < prefix:
        raise ShardFormatError(f"{path}: truncated .npy header ({len(raw)} bytes)")
    size = int.from_bytes(bytes(raw[8:prefix]), "little")
    if size > _MAX_HEADER:
        raise ShardFormatError(f"{path}: .npy header length {size} is implausible (damaged?)")
    return prefix + size


def parse_npy_header(raw: bytes | np.ndarray, path: str) -> NpyHeader:
    """Parse a ``.npy`` header from the file's first bytes (at least the whole header).

    Args:
        raw: The start of the file (bytes, or a uint8 array such as a memory map's view).
        path: The file, for messages.

    Raises:
        ShardFormatError: No magic, an unknown version, a cut or malformed header, an
            object dtype.
    """
    head = bytes(raw[:12])
    end = _header_length(head, path)
    if len(raw) < end:
        raise ShardFormatError(
            f"{path}: truncated .npy header (needs {end} bytes, the file holds {len(raw)})"
        )
    prefix = 10 if head[6] == 1 else 12
    encoding = "utf8" if head[6] == 3 else "latin1"
    try:
        fields = _Literal(bytes(raw[prefix:end]).decode(encoding)).parse()
    except UnicodeDecodeError:
        raise ShardFormatError(f"{path}: .npy header is not {encoding} text") from None
    except _LiteralError as err:
        raise ShardFormatError(f"{path}: .npy header is not a dict literal ({err})") from None
    if not isinstance(fields, dict) or set(fields) != _KEYS:
        keys = sorted(map(str, fields)) if isinstance(fields, dict) else type(fields).__name__
        raise ShardFormatError(f"{path}: .npy header must hold exactly {sorted(_KEYS)}, got {keys}")
    return NpyHeader(
        dtype=_dtype(fields["descr"], path),
        shape=_shape(fields["shape"], path),
        fortran_order=_flag(fields["fortran_order"], path),
        offset=end,
    )


def _dtype(descr: object, path: str) -> np.dtype:
    try:
        if isinstance(descr, str):
            dtype = np.dtype(descr)
        elif isinstance(descr, list):
            dtype = np.lib.format.descr_to_dtype(descr)
        else:
            raise TypeError(type(descr).__name__)
    except (TypeError, ValueError, KeyError, IndexError, SyntaxError):
        raise ShardFormatError(f"{path}: .npy header has an unreadable descr {descr!r}") from None
    if dtype.hasobject:
        raise ShardFormatError(
            f"{path}: .npy file holds Python objects (descr {descr!r}); refused: reading them "
            "means unpickling"
        )
    return dtype


def _shape(shape: object, path: str) -> tuple[int, ...]:
    if not isinstance(shape, tuple) or not all(
        type(n) is int and 0 <= n < (1 << 62) for n in shape
    ):
        raise ShardFormatError(f"{path}: .npy header has an invalid shape {shape!r}")
    if shape and int(np.prod([float(n) for n in shape])) >= (1 << 62):
        raise ShardFormatError(f"{path}: .npy header has an impossible shape {shape!r}")
    return shape


def _flag(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ShardFormatError(f"{path}: .npy header has fortran_order {value!r}, not a bool")
    return value


class _LiteralError(ValueError):
    """Where and why a header stopped being a literal numpy writes."""


_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_MAX_DEPTH = 32  # structured dtypes nest a few levels; deeper is damage
_DIGITS = "0123456789"
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONSTANTS = {"True": True, "False": False}


class _Literal:
    """A strict parser of the Python literals a ``.npy`` header holds.

    Grammar: ``value := dict | tuple | list | string | integer | True | False``; dict keys
    are strings and appear once; ``(x)`` without a comma is ``x``, as in Python. Strings
    take the escapes ``repr`` writes. Whitespace around tokens and one trailing comma in a
    container are allowed; anything else raises ``_LiteralError`` naming the position.
    """

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def parse(self) -> object:
        value = self._value(0)
        if self._peek() != "":
            self._fail("text after the literal")
        return value

    def _fail(self, what: str) -> NoReturn:
        raise _LiteralError(f"{what} at character {self.pos}")

    def _peek(self) -> str:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\n\r":
            self.pos += 1
        return self.text[self.pos : self.pos + 1]

    def _value(self, depth: int) -> object:
        if depth > _MAX_DEPTH:
            self._fail(f"nesting deeper than {_MAX_DEPTH}")
        char = self._peek()
        if char == "":
            self._fail("no literal")
        if char == "{":
            return self._dict(depth)
        if char in "([":
            return self._sequence(depth)
        if char in "'\"":
            return self._string()
        if char == "-" or char in _DIGITS:
            return self._integer()
        word = _WORD.match(self.text, self.pos)
        if word and word.group() in _CONSTANTS:
            self.pos = word.end()
            return _CONSTANTS[word.group()]
        self._fail(f"unexpected {word.group() if word else char!r}")

    def _items(self, close: str, depth: int, item: Callable[[int], object]) -> tuple[list, bool]:
        """Comma-separated items up to ``close``; also whether a comma was seen."""
        self.pos += 1  # the opening bracket
        items, comma = [], False
        while self._peek() != close:
            items.append(item(depth + 1))
            if self._peek() == ",":
                self.pos += 1
                comma = True
            elif self._peek() != close:
                self._fail(f"expected ',' or {close!r}")
        self.pos += 1
        return items, comma

    def _sequence(self, depth: int) -> object:
        opening = self.text[self.pos]
        items, comma = self._items(")" if opening == "(" else "]", depth, self._value)
        if opening == "[":
            return items
        return items[0] if len(items) == 1 and not comma else tuple(items)

    def _dict(self, depth: int) -> dict[str, object]:
        def pair(inner: int) -> tuple[str, object]:
            if self._peek() not in ("'", '"'):
                self._fail("a dict key that is not a string")
            key = self._string()
            if self._peek() != ":":
                self._fail("expected ':'")
            self.pos += 1
            return key, self._value(inner)

        pairs, _ = self._items("}", depth, pair)
        out: dict[str, object] = {}
        for key, value in pairs:
            if key in out:
                raise _LiteralError(f"key {key!r} appears twice")
            out[key] = value
        return out

    def _string(self) -> str:
        quote = self.text[self.pos]
        self.pos += 1
        out = []
        while True:
            if self.pos >= len(self.text):
                self._fail("an unterminated string")
            char = self.text[self.pos]
            self.pos += 1
            if char == quote:
                return "".join(out)
            if char in "\n\r":
                self._fail("a line break inside a string")
            if char != "\\":
                out.append(char)
                continue
            code = self.text[self.pos : self.pos + 1]
            self.pos += 1
            if code in _ESCAPES:
                out.append(_ESCAPES[code])
            elif code in _HEX_ESCAPES:
                digits = self.text[self.pos : self.pos + _HEX_ESCAPES[code]]
                if len(digits) != _HEX_ESCAPES[code] or not all(
                    d in "0123456789abcdefABCDEF" for d in digits
                ):
                    self._fail(f"a malformed \\{code} escape")
                point = int(digits, 16)
                if point > 0x10FFFF:
                    self._fail(f"escape \\{code}{digits} beyond Unicode")
                out.append(chr(point))
                self.pos += len(digits)
            else:
                self._fail(f"an unknown escape \\{code}")

    def _integer(self) -> int:
        start = self.pos
        if self.text[self.pos] == "-":
            self.pos += 1
        digits_start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _DIGITS:
            self.pos += 1
        digits = self.text[digits_start : self.pos]
        if not digits or (len(digits) > 1 and digits[0] == "0") or len(digits) > 40:
            self.pos = start
            self._fail("a malformed integer")
        return int(self.text[start : self.pos])
