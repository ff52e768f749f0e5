"""Locate documents of a one-batch-per-document Arrow file with vectorized reads.

pyarrow decodes record batch metadata one batch at a time (microseconds each, in Python),
which for files of many small documents costs more than reading their tokens. The Arrow
IPC file footer lists every record batch's position, and each batch's metadata is a
flatbuffer with fixed-width fields; reading those fields with numpy gathers over the
memory-mapped file gives the start and length of a whole block of documents at once, and
only of the documents a logical shard actually reads.

Only the simple, common case is handled (uncompressed bodies, fixed-width columns up to
the token column); anything else returns None and the caller falls back to pyarrow.
"""

from __future__ import annotations

import numpy as np

from fmsdata.util.compiled import compiled

__all__ = ["RecordBatchIndex", "batch_rows", "footer_blocks", "footer_length"]

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


class RecordBatchIndex:
    """Where each record batch of an Arrow IPC file starts, read from the footer at once;
    documents (batches) are then located on demand, a block of them per call.

    Args:
        offsets: Byte offset of each batch's message.
        meta_lengths: Length of each message's metadata (prefix and padding included).
        footer: Byte offset of the footer (nothing of a batch lies beyond it).
    """

    def __init__(self, offsets: np.ndarray, meta_lengths: np.ndarray, footer: int):
        self.offsets = offsets
        self.meta_lengths = meta_lengths
        self.footer = footer

    def __len__(self) -> int:
        return len(self.offsets)

    @staticmethod
    def read(buf: np.ndarray) -> RecordBatchIndex | None:
        """The footer's batch list, or None when the file does not look like an Arrow file."""
        found = _batch_blocks(buf) if len(buf) >= 32 and bytes(buf[:6]) == _MAGIC else None
        if found is None or found[2] < 8:
            return None
        offsets, meta_lengths, footer = found
        if len(offsets) and (offsets.min() < 8 or (offsets + meta_lengths).max() > footer):
            return None
        return RecordBatchIndex(offsets, meta_lengths, footer)

    def locate(
        self, buf: np.ndarray, indices: np.ndarray, column: int, itemsize: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Element offsets and lengths of ``column`` in the given batches, or None.

        Every column up to ``column`` must be fixed-width. None means the batches are not
        in the simple layout (compressed, nulls, unexpected metadata): the caller asks
        pyarrow, which also reports real corruption.
        """
        starts, lengths, ok = _locate_batches(
            buf,
            self.offsets[indices],
            self.meta_lengths[indices],
            np.int64(column),
            np.int64(itemsize),
            np.int64(self.footer),
        )
        return (starts, lengths) if ok else None


@compiled
def _locate_batches(
    buf: np.ndarray,
    offsets: np.ndarray,
    meta_lengths: np.ndarray,
    column: int,
    itemsize: int,
    footer: int,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """``RecordBatchIndex.locate`` in one compiled pass over the batches: each message's
    flatbuffer fields read where they lie (a handful of nearby bytes per document), where
    numpy gathered each field for the whole block in turn (about 30 passes over
    scattered pages, a fixed cost per pass that short documents paid per few tokens).
    Returns ``(starts, lengths, ok)``; ``ok`` False: a batch is not in the simple layout,
    or an offset points outside ``buf``."""
    n = len(offsets)
    size = len(buf)
    starts = np.zeros(n, np.int64)
    lengths = np.zeros(n, np.int64)
    for i in range(n):
        # Each read: (position, bytes, signed); a position outside buf fails the block.
        pos = offsets[i]
        if pos < 0 or pos + 4 > size:
            return starts, lengths, False
        first = _le(buf, pos, 4, False)
        at = pos + (8 if first == 0xFFFFFFFF else 4)
        if at < 0 or at + 4 > size:
            return starts, lengths, False
        message = at + _le(buf, at, 4, False)
        header_type = _table_field(buf, message, 1, size)
        header_field = _table_field(buf, message, 2, size)
        if header_type <= 0 or header_field <= 0:
            return starts, lengths, False
        tag = message + header_type
        if tag >= size or buf[tag] != _RECORD_BATCH:
            return starts, lengths, False
        at = message + header_field
        if at + 4 > size:
            return starts, lengths, False
        batch = at + _le(buf, at, 4, False)
        length_field = _table_field(buf, batch, 0, size)
        nodes_field = _table_field(buf, batch, 1, size)
        buffers_field = _table_field(buf, batch, 2, size)
        compression = _table_field(buf, batch, 3, size)
        if length_field < 0 or nodes_field < 0 or buffers_field < 0 or compression < 0:
            return starts, lengths, False
        if compression != 0 or nodes_field == 0 or buffers_field == 0:
            return starts, lengths, False  # compressed bodies, or no column metadata
        length = 0
        if length_field > 0:
            at = batch + length_field
            if at + 8 > size:
                return starts, lengths, False
            length = _le(buf, at, 8, True)
        at = batch + nodes_field
        if at + 4 > size:
            return starts, lengths, False
        nodes = at + _le(buf, at, 4, False)
        at = batch + buffers_field
        if at + 4 > size:
            return starts, lengths, False
        buffers = at + _le(buf, at, 4, False)
        node_at = nodes + 4 + 16 * column
        data = buffers + 4 + 16 * (2 * column + 1)
        if nodes < 0 or buffers < 0 or node_at + 16 > size or data + 16 > size:
            return starts, lengths, False
        if _le(buf, nodes, 4, False) <= column or _le(buf, buffers, 4, False) <= 2 * column + 1:
            return starts, lengths, False
        node_length = _le(buf, node_at, 8, True)
        null_count = _le(buf, node_at + 8, 8, True)
        data_offset = _le(buf, data, 8, True)
        data_length = _le(buf, data + 8, 8, True)
        start = offsets[i] + meta_lengths[i] + data_offset
        if (
            null_count != 0
            or node_length != length  # damaged metadata: pyarrow names it
            or length < 0
            or data_length < length * itemsize
            or start % itemsize != 0
            or start + length * itemsize > footer
        ):
            return starts, lengths, False
        starts[i] = start // itemsize
        lengths[i] = length
    return starts, lengths, True


@compiled
def _le(buf: np.ndarray, pos: int, width: int, signed: bool) -> int:
    """The little-endian integer of ``width`` bytes at ``pos`` (inside ``buf``)."""
    value = 0
    for k in range(width):
        value |= int(buf[pos + k]) << (8 * k)
    if signed and width < 8 and value >= 1 << (8 * width - 1):
        value -= 1 << (8 * width)  # (8 bytes wrap to the signed value by themselves)
    return value


@compiled
def _table_field(buf: np.ndarray, table: int, index: int, size: int) -> int:
    """Byte offset of field ``index`` inside the flatbuffer table at ``table`` (0 when
    absent; -1 when the table or its vtable lies outside ``buf``)."""
    if table < 0 or table + 4 > size:
        return -1
    vtable = table - _le(buf, table, 4, True)
    if vtable < 0 or vtable + 2 > size:
        return -1
    slot = 4 + 2 * index
    if slot >= _le(buf, vtable, 2, False):
        return 0
    if vtable + slot + 2 > size:
        return -1
    return _le(buf, vtable + slot, 2, False)


def footer_blocks(tail: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Byte offset and metadata length of every record batch, from the last bytes of an
    Arrow IPC file (``tail``, which must hold the whole footer); None when they do not
    end like one. Lets a remote file's documents be counted from a range request."""
    found = _batch_blocks(tail)
    return None if found is None else found[:2]


def _batch_blocks(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``footer_blocks`` and where in ``buf`` the footer starts."""
    size = len(buf)
    if size < 10 or bytes(buf[-6:]) != _MAGIC:
        return None
    footer = size - 10 - int(_read(buf, np.array([size - 10]), "<i4")[0])
    if footer >= size - 10 or footer < 0:
        return None
    try:
        root = _deref(buf, np.array([footer]))
        batches_field = _field(buf, root, 3)
        if batches_field[0] == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), footer
        vec = _deref(buf, root + batches_field)
        blocks = vec[0] + 4 + 24 * np.arange(int(_read(buf, vec, "<u4")[0]), dtype=np.int64)
        return _read(buf, blocks, "<i8"), _read(buf, blocks + 8, "<i4"), footer
    except IndexError:
        return None


def footer_length(tail: bytes) -> int | None:
    """Bytes of the footer and trailer an Arrow IPC file ends with (from its last 10 bytes)."""
    if len(tail) < 10 or tail[-6:] != _MAGIC:
        return None
    return int(np.frombuffer(tail[-10:-6], "<i4")[0]) + 10


def _record_batch_tables(buf: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
    """Where the RecordBatch table of each message whose metadata starts at ``positions``
    (continuation prefix included) lies in ``buf``; None when one is not a record batch
    message. Raises IndexError when a position or offset points outside ``buf``."""
    prefix = np.where(_read(buf, positions, "<u4") == _CONTINUATION, 8, 4)
    message = _deref(buf, positions + prefix)
    header_type = _field(buf, message, 1)
    header_field = _field(buf, message, 2)
    if (header_type == 0).any() or (header_field == 0).any():
        return None
    if (_read(buf, message + header_type, "<u1") != _RECORD_BATCH).any():
        return None
    return _deref(buf, message + header_field)


def batch_rows(buf: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
    """The row count (``length``) of the record batch messages whose metadata starts at
    ``positions`` of ``buf`` (each message's continuation prefix included); None when one
    is not a record batch message."""
    try:
        batch = _record_batch_tables(buf, positions)
        if batch is None:
            return None
        length_field = _field(buf, batch, 0)
        return np.where(length_field > 0, _read(buf, batch + length_field, "<i8"), 0)
    except IndexError:
        return None
