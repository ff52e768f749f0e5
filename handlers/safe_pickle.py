"""Read the few pickles token formats hold, without ``pickle``.

Modalities ``.pbin`` files end with their document index as a pickled
``list[tuple[int, int]]``; MDS ``pkl`` columns (CEPE) hold pickled numpy integer arrays.
Unpickling runs whatever the data says, so this module interprets the opcode stream itself
and accepts only what those values need: lists, tuples, integers, strings, bytes, memo
references and framing, and, for arrays only, the five globals numpy's own pickles name
(``ndarray``, ``dtype``, ``_reconstruct``, ``_frombuffer``, and ``_codecs.encode`` and
``bytes()`` for protocol 2 byte strings). Those globals are never imported or called: each maps to a
function here that builds the array from plain values (``np.frombuffer`` of the stored
bytes, an integer dtype from its code). Any other opcode or global — ``os.system``,
``builtins.eval`` and everything else — is refused before anything runs, so a crafted file
can only produce an error, never run code.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from fmsdata.errors import ShardFormatError

__all__ = ["read_int_pairs", "read_int_array"]

_MARK = object()
_INT_CODE = re.compile(r"^[<>|=]?[iu][1248]$")


def read_int_pairs(data: bytes | memoryview, where: str) -> np.ndarray:
    """The ``[n, 2]`` int64 array a pickled list of integer pairs encodes.

    Raises:
        ShardFormatError: Anything else, or a malformed stream (names ``where``).
    """
    value = _interpret(bytes(data), where, {})
    if not isinstance(value, list) or not all(
        isinstance(item, tuple) and len(item) == 2 and all(type(v) is int for v in item)
        for item in value
    ):
        raise ShardFormatError(f"{where}: the pickled index is not a list of integer pairs")
    return np.array(value, dtype=np.int64).reshape(-1, 2)


def read_int_array(data: bytes | memoryview, where: str) -> np.ndarray:
    """The 1-D integer array a pickled numpy array encodes (``pickle.dumps(array)``).

    Raises:
        ShardFormatError: The pickle holds anything else (another global, a float or
            object array, more than one dimension), or is malformed.
    """
    value = _interpret(bytes(data), where, _ARRAY_GLOBALS)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu" or value.ndim > 1:
        what = (
            f"a {value.dtype} array of shape {value.shape}"
            if isinstance(value, np.ndarray)
            else type(value).__name__
        )
        raise ShardFormatError(f"{where}: the pickle holds {what}, not a 1-D integer array")
    return value.reshape(-1)


class _Global:
    """A name the stream asked for; ``build`` makes its value from plain arguments."""

    def __init__(self, name: str, build: Callable[..., Any] | None):
        self.name = name
        self.build = build


class _Pending:
    """An object numpy's pickle creates empty and fills with ``BUILD`` state."""

    def __init__(self, kind: str, value: Any = None):
        self.kind = kind
        self.value = value


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> _Pending:
    if not (isinstance(cls, _Global) and cls.name == "numpy.ndarray"):
        raise ShardFormatError(f"_reconstruct of {getattr(cls, 'name', cls)!r}, not ndarray")
    return _Pending("array")


def _dtype(code: Any, align: Any = False, copy: Any = True) -> _Pending:
    if not isinstance(code, str) or not _INT_CODE.match(code):
        raise ShardFormatError(f"dtype {code!r} is not an integer type")
    return _Pending("dtype", np.dtype(code))


def _latin1(text: Any, encoding: Any = "latin1") -> bytes:
    if not isinstance(text, str) or encoding != "latin1":
        raise ShardFormatError("_codecs.encode is only read for latin1 byte strings")
    return text.encode("latin1")


def _empty_bytes(*args: Any) -> bytes:
    if args:
        raise ShardFormatError("bytes() is only read without arguments (an empty array)")
    return b""


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    return _array_from(shape, dtype, order == "F", buffer)


def _array_from(shape: Any, dtype: Any, fortran: Any, raw: Any) -> np.ndarray:
    if isinstance(dtype, _Pending) and dtype.kind == "dtype":
        dtype = dtype.value
    if not isinstance(dtype, np.dtype):
        raise ShardFormatError(f"array dtype {dtype!r} is not a numpy dtype")
    if not isinstance(raw, (bytes, bytearray)):
        raise ShardFormatError("array data is not a byte string")
    if not (isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape)):
        raise ShardFormatError(f"array shape {shape!r} is not a tuple of sizes")
    count = int(np.prod(shape, dtype=np.int64))
    if count * dtype.itemsize != len(raw):
        raise ShardFormatError(
            f"array of shape {shape} and dtype {dtype} needs {count * dtype.itemsize} bytes, "
            f"the pickle holds {len(raw)}"
        )
    flat = np.frombuffer(bytes(raw), dtype=dtype)
    return flat.reshape(shape, order="F" if fortran else "C")


_ARRAY_GLOBALS: dict[str, Callable[..., Any] | None] = {
    "numpy.ndarray": None,
    "numpy.dtype": _dtype,
    "numpy.core.multiarray._reconstruct": _reconstruct,
    "numpy._core.multiarray._reconstruct": _reconstruct,
    "numpy.core.numeric._frombuffer": _frombuffer,
    "numpy._core.numeric._frombuffer": _frombuffer,
    "_codecs.encode": _latin1,
    "__builtin__.bytes": _empty_bytes,  # protocol 2's empty byte string
    "builtins.bytes": _empty_bytes,
}


def _reduce(target: Any, args: Any, where: str) -> Any:
    if not isinstance(target, _Global) or target.build is None or not isinstance(args, tuple):
        raise ShardFormatError(f"{where}: the pickle calls {getattr(target, 'name', target)!r}")
    try:
        return target.build(*args)
    except ShardFormatError as err:
        raise ShardFormatError(f"{where}: {err}") from None
    except TypeError:
        raise ShardFormatError(
            f"{where}: {target.name} called with {len(args)} arguments"
        ) from None


def _build(obj: Any, state: Any, where: str) -> Any:
    if isinstance(obj, _Pending) and obj.kind == "dtype" and isinstance(state, tuple):
        order = state[1] if len(state) > 1 else "|"
        if order not in ("<", ">", "|", "="):
            raise ShardFormatError(f"{where}: dtype byte order {order!r}")
        return obj.value.newbyteorder(">") if order == ">" else obj.value
    is_array = isinstance(obj, _Pending) and obj.kind == "array"
    if is_array and isinstance(state, tuple) and len(state) == 5:
        _, shape, dtype, fortran, raw = state
        try:
            return _array_from(shape, dtype, fortran, raw)
        except ShardFormatError as err:
            raise ShardFormatError(f"{where}: {err}") from None
    raise ShardFormatError(f"{where}: the pickle sets the state of {type(obj).__name__}")


def _interpret(data: bytes, where: str, allowed: dict[str, Callable[..., Any] | None]) -> Any:
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    pos, end = 0, len(data)
    unpack_i, unpack_H, unpack_I, unpack_Q = (
        struct.Struct(f).unpack_from for f in ("<i", "<H", "<I", "<Q")
    )

    def pop_mark() -> list[Any]:
        for k in range(len(stack) - 1, -1, -1):
            if stack[k] is _MARK:
                items = stack[k + 1 :]
                del stack[k:]
                return items
        raise ShardFormatError(f"{where}: malformed pickle (no mark)")

    def take(size: int) -> bytes:
        nonlocal pos
        if pos + size > end:
            raise ShardFormatError(f"{where}: malformed pickle (a value runs past the end)")
        chunk = data[pos : pos + size]
        pos += size
        return chunk

    def find_global(module: str, name: str) -> _Global:
        full = f"{module}.{name}"
        if full not in allowed:
            raise ShardFormatError(
                f"{where}: the pickle names the global {full!r}; refused (only numpy integer "
                "arrays are read from pickles, and nothing in them is executed)"
            )
        return _Global(full, allowed[full])

    try:
        while pos < end:
            op = data[pos]
            pos += 1
            if op == 0x4B:  # BININT1
                stack.append(data[pos])
                pos += 1
            elif op == 0x4D:  # BININT2
                stack.append(unpack_H(data, pos)[0])
                pos += 2
            elif op == 0x4A:  # BININT
                stack.append(unpack_i(data, pos)[0])
                pos += 4
            elif op == 0x8A:  # LONG1
                size = data[pos]
                stack.append(int.from_bytes(data[pos + 1 : pos + 1 + size], "little", signed=True))
                pos += 1 + size
            elif op == 0x8B:  # LONG4
                size = unpack_I(data, pos)[0]
                stack.append(int.from_bytes(data[pos + 4 : pos + 4 + size], "little", signed=True))
                pos += 4 + size
            elif op == 0x86:  # TUPLE2
                b = stack.pop()
                stack[-1] = (stack[-1], b)
            elif op == 0x85:  # TUPLE1
                stack[-1] = (stack[-1],)
            elif op == 0x87:  # TUPLE3
                c, b = stack.pop(), stack.pop()
                stack[-1] = (stack[-1], b, c)
            elif op == 0x74:  # TUPLE
                stack.append(tuple(pop_mark()))
            elif op == 0x29:  # EMPTY_TUPLE
                stack.append(())
            elif op == 0x94:  # MEMOIZE
                memo[len(memo)] = stack[-1]
            elif op == 0x71:  # BINPUT
                memo[data[pos]] = stack[-1]
                pos += 1
            elif op == 0x72:  # LONG_BINPUT
                memo[unpack_I(data, pos)[0]] = stack[-1]
                pos += 4
            elif op == 0x68:  # BINGET
                stack.append(memo[data[pos]])
                pos += 1
            elif op == 0x6A:  # LONG_BINGET
                stack.append(memo[unpack_I(data, pos)[0]])
                pos += 4
            elif op == 0x28:  # MARK
                stack.append(_MARK)
            elif op == 0x5D:  # EMPTY_LIST
                stack.append([])
            elif op == 0x65:  # APPENDS
                items = pop_mark()
                stack[-1].extend(items)
            elif op == 0x61:  # APPEND
                item = stack.pop()
                stack[-1].append(item)
            elif op == 0x6C:  # LIST
                stack.append(pop_mark())
            elif op == 0x80:  # PROTO
                pos += 1
            elif op == 0x95:  # FRAME
                pos += 8
            elif op == 0x2E:  # STOP
                if len(stack) != 1 or pos != end:
                    raise ShardFormatError(f"{where}: malformed pickle (stray data around STOP)")
                return stack[0]
            elif allowed and op == 0x4E:  # NONE
                stack.append(None)
            elif allowed and op in (0x88, 0x89):  # NEWTRUE, NEWFALSE
                stack.append(op == 0x88)
            elif allowed and op == 0x8C:  # SHORT_BINUNICODE
                stack.append(take(data[pos] + 1)[1:].decode("utf-8"))
            elif allowed and op == 0x58:  # BINUNICODE
                stack.append(take(4 + unpack_I(data, pos)[0])[4:].decode("utf-8"))
            elif allowed and op == 0x43:  # SHORT_BINBYTES
                stack.append(take(data[pos] + 1)[1:])
            elif allowed and op == 0x42:  # BINBYTES
                stack.append(take(4 + unpack_I(data, pos)[0])[4:])
            elif allowed and op in (0x8E, 0x96):  # BINBYTES8, BYTEARRAY8
                stack.append(take(8 + unpack_Q(data, pos)[0])[8:])
            elif allowed and op == 0x93:  # STACK_GLOBAL
                name, module = stack.pop(), stack.pop()
                if not (isinstance(module, str) and isinstance(name, str)):
                    raise ShardFormatError(f"{where}: malformed pickle (global name)")
                stack.append(find_global(module, name))
            elif allowed and op == 0x63:  # GLOBAL
                line_end = data.index(b"\n", pos)
                module = data[pos:line_end].decode("utf-8")
                name_end = data.index(b"\n", line_end + 1)
                name = data[line_end + 1 : name_end].decode("utf-8")
                pos = name_end + 1
                stack.append(find_global(module, name))
            elif allowed and op == 0x52:  # REDUCE
                args = stack.pop()
                stack[-1] = _reduce(stack[-1], args, where)
            elif allowed and op == 0x62:  # BUILD
                state = stack.pop()
                stack[-1] = _build(stack[-1], state, where)
            else:
                raise ShardFormatError(
                    f"{where}: the pickle holds opcode {bytes([op])!r} at byte {pos - 1}; "
                    f"only {'numpy integer arrays' if allowed else 'lists of integer pairs'} "
                    "are read (nothing in it is executed)"
                )
    except (IndexError, KeyError, AttributeError, struct.error, TypeError, ValueError) as err:
        raise ShardFormatError(f"{where}: malformed pickle ({type(err).__name__}: {err})") from None
    raise ShardFormatError(f"{where}: pickle ends without STOP")
