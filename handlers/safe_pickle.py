"""Read a pickled ``list[tuple[int, int]]`` without ``pickle``.

Modalities ``.pbin`` files end with their document index as a pickle. Unpickling runs
whatever the data says, so this module interprets the opcode stream itself and accepts
only what such a list needs (lists, tuples, integers, memo references, framing). Any other
opcode — the ones that import and call objects among them — is refused, so a crafted file
can only produce an error, never run code.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from fmsdata.errors import ShardFormatError

__all__ = ["read_int_pairs"]

_MARK = object()


def read_int_pairs(data: bytes | memoryview, where: str) -> np.ndarray:
    """The ``[n, 2]`` int64 array a pickled list of integer pairs encodes.

    Raises:
        ShardFormatError: Anything else, or a malformed stream (names ``where``).
    """
    value = _interpret(bytes(data), where)
    if not isinstance(value, list) or not all(
        isinstance(item, tuple) and len(item) == 2 and all(type(v) is int for v in item)
        for item in value
    ):
        raise ShardFormatError(f"{where}: the pickled index is not a list of integer pairs")
    return np.array(value, dtype=np.int64).reshape(-1, 2)


def _interpret(data: bytes, where: str) -> Any:
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
            else:
                raise ShardFormatError(
                    f"{where}: the pickled index holds opcode {bytes([op])!r} at byte {pos - 1}; "
                    "only lists of integer pairs are read (nothing in it is executed)"
                )
    except (IndexError, KeyError, AttributeError, struct.error, TypeError) as err:
        raise ShardFormatError(f"{where}: malformed pickle ({type(err).__name__}: {err})") from None
    raise ShardFormatError(f"{where}: pickle ends without STOP")
