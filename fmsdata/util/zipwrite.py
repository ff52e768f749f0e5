"""Writing a zip archive whose members are deflated with a chosen zlib strategy.

``zipfile`` deflates every member with zlib's default strategy, which looks for repeated
strings everywhere. Columns of small integers (a loader state's arrays) are mostly runs
and near-random values, where that search finds little: zlib's run-length strategy
(``Z_RLE``) deflates them about twice as fast and smaller. The archive is a plain zip
(deflate, no zip64, fixed timestamps: the same members give the same bytes) that
``zipfile`` and any unzip read.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

__all__ = ["zip_bytes", "RLE", "STRINGS"]

RLE = zlib.Z_RLE  # for arrays of numbers
STRINGS = zlib.Z_DEFAULT_STRATEGY  # for text

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_VERSION = 20  # 2.0: deflate
_DEFLATE = 8
_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01, the zip epoch (time 00:00:00)
_LIMIT = 2**32 - 1


def zip_bytes(members: Sequence[tuple[str, bytes, int]], level: int = 1) -> bytes:
    """A zip archive of ``(name, data, strategy)`` members, deflated at ``level``.

    Raises:
        ValueError: A member or the archive reaches 4 GiB (zip64 is not written).
    """
    out = bytearray()
    central = bytearray()
    for name, data, strategy in members:
        raw = name.encode("utf-8")
        packer = zlib.compressobj(level, zlib.DEFLATED, -15, 8, strategy)
        packed = packer.compress(data) + packer.flush()
        crc = zlib.crc32(data)
        offset = len(out)
        if max(len(data), len(packed), offset) >= _LIMIT:
            raise ValueError(f"zip member {name!r} is too large for a zip without zip64")
        sizes = (crc, len(packed), len(data), len(raw))
        out += _LOCAL.pack(0x04034B50, _VERSION, 0, _DEFLATE, 0, _DATE, *sizes, 0)
        out += raw
        out += packed
        central += _CENTRAL.pack(
            0x02014B50, _VERSION, _VERSION, 0, _DEFLATE, 0, _DATE, *sizes, 0, 0, 0, 0, 0, offset
        )
        central += raw
    start = len(out)
    if start + len(central) >= _LIMIT:
        raise ValueError("zip archive is too large for a zip without zip64")
    count = len(members)
    out += central
    out += _END.pack(0x06054B50, 0, 0, count, count, len(central), start, 0)
    return bytes(out)
