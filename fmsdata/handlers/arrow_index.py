"""Locate every document of a one-batch-per-document Arrow file in one vectorized pass.

pyarrow decodes record batch metadata one batch at a time (microseconds each, in Python),
which for files of many small documents costs more than reading their tokens. The Arrow
IPC file footer lists every record batch's position, and each batch's metadata is a
flatbuffer with fixed-width fields; reading those fields with numpy gathers over the
memory-mapped file gives the start and length of every document at once.

Only the simple, common case is handled (uncompressed bodies, fixed-width columns up to
the token column); anything else returns None and the caller falls back to pyarrow.
"""

from __future__ import annotations

import numpy as np

__all__ = ["index_record_batches"]

_MAGIC = b"ARROW1"
_CONTINUATION = 0xFFFFFFFF
_RECORD_BATCH = 3  # MessageHeader union tag


def _read(buf: np.ndarray, pos: np.ndarray, dtype: str) -> np.ndarray:
    """Little-endian values of ``dtype`` at byte positions ``pos``."""
    size = np.dtype(dtype).itemsize
    if len(pos) and pos.min() < 0:
        raise IndexError("negative position")
    return buf[pos[:, None] + np.arange(size)].view(dtype).reshape(-1).astype(np.int64)


def _field(buf: np.ndarray, table: np.ndarray, index: int) -> np.ndarray:
    """Byte offset of field ``index`` inside each flatbuffer table (0 when absent)."""
    vtable = table - _read(buf, table, "<i4")
    vt_size = _read(buf, vtable, "<u2")
    slot = 4 + 2 * index
    present = slot < vt_size
    offset = np.zeros(len(table), dtype=np.int64)
    if present.any():
        offset[present] = _read(buf, vtable[present] + slot, "<u2")
    return offset


def _deref(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Follow flatbuffer offsets stored at ``pos``."""
    return pos + _read(buf, pos, "<u4")


def index_record_batches(
    buf: np.ndarray, column: int, itemsize: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Element offsets and lengths of ``column`` in every record batch, or None.

    Args:
        buf: The whole file as a uint8 array (memory-mapped).
        column: Index of the token column; every column up to it must be fixed-width.
        itemsize: Byte width of the token type.

    Returns:
        ``(starts, lengths)`` in elements of the token type, or None when the file is not
        in the simple layout (the caller then asks pyarrow, which also reports corruption).
    """
    size = len(buf)
    if size < 32 or bytes(buf[:6]) != _MAGIC or bytes(buf[-6:]) != _MAGIC:
        return None
    footer_len = int(_read(buf, np.array([size - 10]), "<i4")[0])
    footer = size - 10 - footer_len
    if footer_len <= 0 or footer < 8:
        return None
    try:
        root = _deref(buf, np.array([footer]))
        batches_field = _field(buf, root, 3)
        if batches_field[0] == 0:
            return None
        vec = _deref(buf, root + batches_field)
        n = int(_read(buf, vec, "<u4")[0])
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        blocks = vec[0] + 4 + 24 * np.arange(n, dtype=np.int64)
        offset = _read(buf, blocks, "<i8")
        meta_len = _read(buf, blocks + 8, "<i4")
        if offset.min() < 8 or (offset + meta_len).max() > footer:
            return None
        prefix = np.where(_read(buf, offset, "<u4") == _CONTINUATION, 8, 4)
        message = _deref(buf, offset + prefix)
        header_type = _field(buf, message, 1)
        header_field = _field(buf, message, 2)
        if (header_type == 0).any() or (header_field == 0).any():
            return None
        if (_read(buf, message + header_type, "<u1") != _RECORD_BATCH).any():
            return None
        batch = _deref(buf, message + header_field)
        length_field = _field(buf, batch, 0)
        nodes_field = _field(buf, batch, 1)
        buffers_field = _field(buf, batch, 2)
        if (_field(buf, batch, 3) != 0).any() or (nodes_field == 0).any() or (buffers_field == 0).any():
            return None  # compressed bodies, or no column metadata
        lengths = np.where(length_field > 0, _read(buf, batch + length_field, "<i8"), 0)
        nodes = _deref(buf, batch + nodes_field)
        buffers = _deref(buf, batch + buffers_field)
        if (_read(buf, nodes, "<u4") <= column).any() or (_read(buf, buffers, "<u4") <= 2 * column + 1).any():
            return None
        null_count = _read(buf, nodes + 4 + 16 * column + 8, "<i8")
        data = buffers + 4 + 16 * (2 * column + 1)
        data_offset = _read(buf, data, "<i8")
        data_length = _read(buf, data + 8, "<i8")
    except IndexError:
        return None
    start = offset + meta_len + data_offset
    if (
        (null_count != 0).any()
        or (lengths < 0).any()
        or (data_length < lengths * itemsize).any()
        or (start % itemsize != 0).any()
        or (start + lengths * itemsize > footer).any()
    ):
        return None
    return start // itemsize, lengths
