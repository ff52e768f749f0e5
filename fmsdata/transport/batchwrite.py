"""A worker's rows written as the final batch tensors, where the main process hands them out.

The worker turns its packed int32 lines into the outputs of the causal-LM step in one
compiled pass per output: ``input_ids`` (the line less its last token) and ``labels`` (less
its first, ``IGNORE_INDEX`` from a padded line's last content token on, and on request
the first few of every line), widened to the output dtype (int64, or int32), and on
request ``position_ids`` (restarting at each piece of a document) and ``document_ids``.
Each row goes to its canonical row of the batch, in the batch's ring slot
(``fmsdata.transport.batchring``) or, where that slot is still held, in fresh memory sent with the
item: the main process hands them out without reading a token.

The document pieces of the lines are copied here too (``copy_spans``: every file's token
buffer in one call), a batch at a time just before that batch is written when no
token-level stage needs the item's rows first: a batch's int32 rows (128 KiB at 8 x 4096)
are then still in the core's cache when they are widened, where an item's rows (8 MiB)
were not. That saved nothing measurable on the 2-core box, whose batch write is bound by
the memory bus; what the copy gained there came from one call per item instead of one per
file and per batch, and from prefetching the pieces ahead (``_AHEAD``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from fmsdata.stages.outputs import IGNORE_INDEX
from fmsdata.transport.batchring import BatchRing
from fmsdata.util.compiled import compiled, intrinsic

__all__ = [
    "COPIED",
    "PIECE_OUT_OF_BOUNDS",
    "TOKEN_OUT_OF_RANGE",
    "PendingCopy",
    "RowPieces",
    "copy_spans",
    "source_kind",
    "token_fields",
    "write_batches",
]

_INT32_MAX = 2**31 - 1

# copy_spans outcomes: every piece copied, a token outside ``[0, limit]`` (it would not fit
# an int32 row, or is past the vocabulary), a piece outside its file's token buffer.
COPIED, TOKEN_OUT_OF_RANGE, PIECE_OUT_OF_BOUNDS = 0, 1, 2

# Pieces ahead of the one being copied whose first bytes copy_spans asks the cache for.
_AHEAD = 6

# The token buffers copy_spans reads, by kind: native-order integers (what handlers map);
# a kind's items are 1 << (kind >> 1) bytes.
_SOURCE_DTYPES = tuple(
    np.dtype(t)
    for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64)
)
# Each kind by (dtype kind, item size): two attribute reads, where comparing dtypes costs
# a few hundred nanoseconds each (this runs for every file of every item).
_KIND_OF = {(t.kind, t.itemsize): k for k, t in enumerate(_SOURCE_DTYPES)}


def token_fields(position_ids: bool, document_ids: bool) -> tuple[str, ...]:
    """The per-token outputs of a batch, in batch order (``cu_seqlens`` and
    ``max_seqlen``, which are per piece, come between the last two)."""
    return (
        ("input_ids", "labels")
        + (("position_ids",) if position_ids else ())
        + (("document_ids",) if document_ids else ())
    )


class RowPieces:
    """Each line's input pieces: flat ``lengths`` (a line's sum to ``seq``), ``counts``
    per line, flat document ``ids`` (or None)."""

    def __init__(self, lengths: np.ndarray, counts: np.ndarray, ids: np.ndarray | None):
        self.lengths, self.counts, self.ids = lengths, counts, ids
        self.first = np.cumsum(counts) - counts


def source_kind(buffer: np.ndarray) -> int:
    """The kind ``copy_spans`` reads ``buffer`` as, or -1 where it cannot (not a contiguous
    one-dimensional array of native-order integers: read through the handler instead)."""
    dtype = buffer.dtype
    if buffer.ndim != 1 or not buffer.flags.c_contiguous or not dtype.isnative:
        return -1
    return _KIND_OF.get((dtype.kind, dtype.itemsize), -1)


def _view_in_python(address: int, size: int, dtype: Any) -> np.ndarray:
    if size == 0:
        return np.empty(0, dtype=dtype)
    pointer = ctypes.cast(int(address), ctypes.POINTER(np.ctypeslib.as_ctypes_type(dtype)))
    return np.ctypeslib.as_array(pointer, (int(size),))


@intrinsic(_view_in_python)
def _view_at() -> Any:
    """``_view_at(address, size, dtype)``: the read-only array of ``size`` items of the
    integer ``dtype`` at memory ``address``, made without a call into Python: how one
    compiled call reads the token buffers of many files, of any dtypes (numba's arrays
    carry their dtype in their type, so a list of them must share one). The caller keeps
    the buffers alive for the call. The view claims no alignment, as a file's token buffer
    may start at any byte."""
    from numba.core import cgutils, types
    from numba.extending import intrinsic as numba_intrinsic
    from numba.np.arrayobj import make_array, populate_array

    @numba_intrinsic
    def view_at(typingctx, address, size, dtype):  # type: ignore[no-untyped-def]
        if not (
            isinstance(address, types.Integer)
            and isinstance(size, types.Integer)
            and isinstance(dtype, types.NumberClass)
            and isinstance(dtype.instance_type, types.Integer)
        ):
            return None
        result = types.Array(dtype.instance_type, 1, "C", readonly=True, aligned=False)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            address, size, _ = args
            array = make_array(result)(context, builder)
            item = context.get_data_type(result.dtype)
            itemsize = context.get_constant(types.intp, context.get_abi_sizeof(item))
            count = context.cast(builder, size, signature.args[1], types.intp)
            at = context.cast(builder, address, signature.args[0], types.intp)
            populate_array(
                array,
                data=builder.inttoptr(at, item.as_pointer()),
                shape=cgutils.pack_array(builder, [count]),
                strides=cgutils.pack_array(builder, [itemsize]),
                itemsize=itemsize,
                meminfo=None,
            )
            return array._getvalue()

        return result(address, size, dtype), codegen

    return view_at


def _no_prefetch(address: int) -> None:
    """Python reads no memory ahead."""


@intrinsic(_no_prefetch)
def _prefetch() -> Any:
    """``_prefetch(address)``: ask the core to bring the cache line at ``address`` in
    (LLVM's ``llvm.prefetch``, for reading, kept in every cache level). A hint: it never
    faults, whatever the address, and changes no result."""
    import llvmlite.ir as ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def prefetch(typingctx, address):  # type: ignore[no-untyped-def]
        if not isinstance(address, types.Integer):
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            byte = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            function = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]),
                "llvm.prefetch.p0i8",
            )
            at = context.cast(builder, args[0], signature.args[0], types.intp)
            pointer = builder.inttoptr(at, byte)
            # read (0), keep in all levels (3), data cache (1)
            builder.call(function, [pointer, i32(0), i32(3), i32(1)])
            return context.get_dummy_value()

        return types.void(address), codegen

    return prefetch


@compiled(inline=True)
def _copy_piece(source, out, s, d, n, limit, lowest, highest):  # type: ignore[no-untyped-def]
    """``source[s:s + n]`` into ``out[d:]``; whether every token is in ``[0, limit]``.

    ``lowest``/``highest``: the range of the source's dtype as read into int64 (uint64's
    is cut at ``2**63 - 1``). Where all of it fits, the tokens are copied without the
    check, whose running min/max halves the copy's speed. The caller checked ``s`` and
    ``d`` to be in their arrays; their signs are checked again here, which tells the
    compiler no index is negative: it needs that to vectorize the loop (ten times
    faster)."""
    if s < 0 or d < 0:
        return False
    if lowest >= 0 and highest <= limit:
        for t in range(n):
            out[d + t] = source[s + t]
        return True
    low = high = np.int64(source[s])
    for t in range(n):
        value = np.int64(source[s + t])
        out[d + t] = value
        low = min(low, value)
        high = max(high, value)
    return low >= 0 and high <= limit


@compiled
def copy_spans(  # type: ignore[no-untyped-def]
    addresses, sizes, kinds, span_source, src, dst, n_copy, begin, end, out, limit
):
    """Copy the pieces of spans ``begin:end`` into ``out``, the flattened int32 rows.

    Span ``i`` reads ``n_copy[i]`` tokens from item ``src[i]`` of the token buffer
    ``span_source[i]`` (-1: none, its piece is written by other means), the buffer of
    ``sizes[f]`` items of kind ``kinds[f]`` (``source_kind``) at ``addresses[f]``, and
    writes them at ``out[dst[i]:]``. Returns ``(COPIED, -1)``, or the outcome and the span
    that stopped the copy (empty pieces are skipped): ``TOKEN_OUT_OF_RANGE`` for a token
    outside ``[0, limit]`` (``limit`` below ``2**31``: it fits an int32 row),
    ``PIECE_OUT_OF_BOUNDS`` for a piece that is not inside its buffer (the file changed
    since its spans were made). One pass over the tokens, no index arrays: the loop over a
    piece compiles to a vectorized widening copy.
    """
    room = out.shape[0]
    for i in range(begin, end):
        ahead = i + _AHEAD
        if ahead < end and span_source[ahead] >= 0:
            # A piece starts at a random place of a file: its first lines miss every cache
            # (and its page the TLB). Ask for them while the pieces before it are copied.
            f = span_source[ahead]
            at = addresses[f] + src[ahead] * (1 << (kinds[f] >> 1))
            _prefetch(at)
            _prefetch(at + 64)
        n = n_copy[i]
        f = span_source[i]
        if n == 0 or f < 0:
            continue
        s = src[i]
        d = dst[i]
        size = sizes[f]
        if s < 0 or s + n > size or d < 0 or d + n > room:
            return PIECE_OUT_OF_BOUNDS, i
        at = addresses[f]
        kind = kinds[f]
        if kind == 0:
            fits = _copy_piece(_view_at(at, size, np.uint8), out, s, d, n, limit, 0, 255)
        elif kind == 1:
            fits = _copy_piece(_view_at(at, size, np.int8), out, s, d, n, limit, -128, 127)
        elif kind == 2:
            fits = _copy_piece(_view_at(at, size, np.uint16), out, s, d, n, limit, 0, 65535)
        elif kind == 3:
            fits = _copy_piece(_view_at(at, size, np.int16), out, s, d, n, limit, -32768, 32767)
        elif kind == 4:
            fits = _copy_piece(_view_at(at, size, np.uint32), out, s, d, n, limit, 0, 2**32 - 1)
        elif kind == 5:
            fits = _copy_piece(
                _view_at(at, size, np.int32), out, s, d, n, limit, -(2**31), 2**31 - 1
            )
        elif kind == 6:
            fits = _copy_piece(_view_at(at, size, np.uint64), out, s, d, n, limit, 0, 2**63 - 1)
        elif kind == 7:
            fits = _copy_piece(
                _view_at(at, size, np.int64), out, s, d, n, limit, -(2**63), 2**63 - 1
            )
        else:  # not a kind of source_kind: read nothing
            return PIECE_OUT_OF_BOUNDS, i
        if not fits:
            return TOKEN_OUT_OF_RANGE, i
    return COPIED, -1


@dataclass
class PendingCopy:
    """The document pieces of an item's int32 rows, laid out and not yet copied.

    Line ``j`` of the rows holds spans ``line_spans[j]:line_spans[j + 1]`` (the arrays of
    ``copy_spans``, which say where each span's piece comes from and goes; ``limit`` in
    ``[0, 2**31)``). ``buffers`` hold the token buffers at ``addresses`` (in any order), so
    that they stay mapped while the copy reads them by address: a reader closed or
    evicted meanwhile unmaps nothing a buffer still views. ``refuse(outcome, span)``
    raises the error naming the file for a copy that stopped.
    """

    line_spans: np.ndarray
    addresses: np.ndarray
    sizes: np.ndarray
    kinds: np.ndarray
    span_source: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    n_copy: np.ndarray
    limit: int
    buffers: list[np.ndarray]
    refuse: Callable[[int, int], None]

    def __post_init__(self) -> None:
        if not 0 <= self.limit <= _INT32_MAX:
            raise ValueError(f"limit {self.limit} is outside [0, 2**31): tokens go to int32 rows")

    def copy(self, rows: np.ndarray, begin: int, end: int) -> None:
        """Copy the pieces of lines ``begin:end`` into ``rows``, the item's whole rows
        (``dst`` counts from their start)."""
        outcome, span = copy_spans(
            self.addresses,
            self.sizes,
            self.kinds,
            self.span_source,
            self.src,
            self.dst,
            self.n_copy,
            int(self.line_spans[begin]),
            int(self.line_spans[end]),
            rows.reshape(-1),
            self.limit,
        )
        if outcome != COPIED:
            self.refuse(outcome, span)


def _store_in_python(row: np.ndarray, index: int, value: Any) -> None:
    row[index] = value


@intrinsic(_store_in_python)
def _stream_store() -> Any:
    """``_stream_store(row, j, value)``: ``row[j] = value`` as a non-temporal store, which
    writes the line to memory without first reading it into the cache (read for ownership)
    and without allocating it there. The batches a worker writes are read next by another
    process or the GPU copy, not by this core: written the ordinary way, every cache line of
    them was read from memory first, and the item's int32 rows they come from were pushed
    out of the cache (the write alone takes 0.76-0.88 of the ordinary stores' time,
    ``benchmarks/batchwrite.py``). ``row``: one-dimensional, writable, of a numeric dtype;
    ``j`` in ``range(len(row))`` (not checked, as numba checks no index: callers pass
    rows of the batch they made). Order the stores with ``_fence`` before another process
    reads them."""
    import llvmlite.ir as ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def stream_store(typingctx, row, index, value):  # type: ignore[no-untyped-def]
        if not (
            isinstance(row, types.Array)
            and row.ndim == 1
            and row.mutable
            and isinstance(row.dtype, (types.Integer, types.Float))
            and not isinstance(row.dtype, types.Boolean)
            and isinstance(index, types.Integer)
        ):
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            array_type = signature.args[0]
            array = context.make_array(array_type)(context, builder, args[0])
            pointer = cgutils.get_item_pointer(
                context, builder, array_type, array, [args[1]], wraparound=False
            )
            cast = context.cast(builder, args[2], signature.args[2], array_type.dtype)
            store = builder.store(cast, pointer)
            store.set_metadata(
                "nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
            )
            return context.get_dummy_value()

        return types.void(row, index, value), codegen

    return stream_store


def _no_fence() -> None:
    """Python makes ordinary stores, which need no fence of their own."""


@intrinsic(_no_fence)
def _store_fence() -> Any:
    """A store fence: non-temporal stores are weakly ordered, so they are fenced before
    another process may read what they wrote. On x86 ``sfence``, the instruction the
    architecture names for them (LLVM's ``fence seq_cst`` compiles to a locked ``or``
    there, whose effect on them the manuals leave unclear); elsewhere ``fence seq_cst``."""
    import platform

    from numba.core import cgutils, types
    from numba.extending import intrinsic as numba_intrinsic

    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")

    @numba_intrinsic
    def store_fence(typingctx):  # type: ignore[no-untyped-def]
        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            if x86:
                import llvmlite.ir as ir

                sfence = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence"
                )
                builder.call(sfence, [])
            else:
                builder.fence("seq_cst")
            return context.get_dummy_value()

        return types.void(), codegen

    return store_fence


@compiled
def _fence() -> None:
    """Order the non-temporal stores made so far before any store after it."""
    _store_fence()


@compiled
def _shift(tokens, content, rows, inputs, labels, ignore, masked):  # type: ignore[no-untyped-def]
    """Row ``i`` of ``tokens`` into row ``rows[i]`` of ``inputs`` and ``labels`` (in their
    dtype); the first ``masked`` labels of each row and those past its content are
    ``ignore``."""
    seq = inputs.shape[1]
    for i in range(tokens.shape[0]):
        into, label = inputs[rows[i]], labels[rows[i]]
        keep = min(max(content[i] - 1, 0), seq)
        start = min(masked, keep)
        for j in range(seq):
            _stream_store(into, j, np.int64(tokens[i, j]))
        for j in range(start):
            _stream_store(label, j, np.int64(ignore))
        for j in range(start, keep):
            _stream_store(label, j, np.int64(tokens[i, j + 1]))
        for j in range(keep, seq):
            _stream_store(label, j, np.int64(ignore))


@compiled
def _positions(lengths, first, counts, rows, out):  # type: ignore[no-untyped-def]
    for i in range(rows.shape[0]):
        into = out[rows[i]]
        j = 0
        for p in range(first[i], first[i] + counts[i]):
            for t in range(lengths[p]):
                _stream_store(into, j + t, np.int64(t))
            j += lengths[p]


@compiled
def _document_ids(lengths, first, counts, ids, rows, out):  # type: ignore[no-untyped-def]
    for i in range(rows.shape[0]):
        into = out[rows[i]]
        j = 0
        for p in range(first[i], first[i] + counts[i]):
            for t in range(lengths[p]):
                _stream_store(into, j + t, np.int64(ids[p]))
            j += lengths[p]


@compiled
def _write_item(  # type: ignore[no-untyped-def]
    tokens, content, rows, local, offsets, targets, ring, overflow, ignore, masked,
    positions_at, ids_at, lengths, piece_first, piece_counts, ids,
    copy, line_spans, addresses, sizes, kinds, span_source, src, dst, n_copy, limit,
):  # fmt: skip
    """Write an item's lines as its batches, one batch at a time.

    Batch ``k`` holds lines ``offsets[k]:offsets[k + 1]``: into ring slot ``targets[k]``
    at rows ``rows`` of the batch, or, for ``targets[k]`` -1, into ``overflow`` at their
    item rows (``local``); the first ``masked`` labels of each line are ``ignore``. Where
    ``copy``, the batch's document pieces are copied into its int32 rows first
    (``copy_spans``; a failed copy returns its outcome and span and writes no more).
    Fields ``positions_at`` and ``ids_at`` (-1: not asked for) are written from the lines'
    input pieces. The stores are fenced before it returns.
    """
    flat = tokens.reshape(-1)
    for k in range(offsets.shape[0] - 1):
        a = offsets[k]
        b = offsets[k + 1]
        if b == a:
            continue
        if copy:
            outcome, span = copy_spans(
                addresses, sizes, kinds, span_source, src, dst, n_copy,
                line_spans[a], line_spans[b], flat, limit,
            )  # fmt: skip
            if outcome != COPIED:
                return outcome, span
        if targets[k] >= 0:
            out = ring[targets[k]]
            at = rows[a:b]
        else:
            out = overflow
            at = local[a:b]
        _shift(tokens[a:b], content[a:b], at, out[0], out[1], ignore, masked)
        if positions_at >= 0:
            _positions(lengths, piece_first[a:b], piece_counts[a:b], at, out[positions_at])
        if ids_at >= 0:
            _document_ids(lengths, piece_first[a:b], piece_counts[a:b], ids, at, out[ids_at])
    _fence()  # the batches are written before the item that says so is sent
    return COPIED, -1


_NONE = np.zeros(0, dtype=np.int64)


def write_batches(
    ring: BatchRing | None,
    first: int,
    fields: tuple[str, ...],
    offsets: np.ndarray,
    rows: np.ndarray,
    tokens: np.ndarray,
    content: np.ndarray,
    pieces: RowPieces | None,
    pending: PendingCopy | None = None,
    dtype: torch.dtype = torch.int64,
    masked: int = 0,
) -> tuple[np.ndarray, torch.Tensor | None]:
    """Write an item's lines as batches ``first``, ``first + 1``, ...

    Batch ``k`` holds the item's lines ``offsets[k]:offsets[k + 1]`` at rows ``rows`` of
    the batch, in ``dtype`` (the ring's), the first ``masked`` labels of each line ignored.
    ``pending``: the document pieces of ``tokens`` not copied yet (copied here, a batch at
    a time). Returns which batches went to their ring slot and, for the others, the fresh
    ``[fields, lines, seq]`` tensor holding their lines in item order (shared memory in a
    worker: it travels by handle, not by copy).
    """
    n_batches = len(offsets) - 1
    seq = tokens.shape[1] - 1
    batch_size = ring.data.shape[2] if ring is not None else 0
    if ring is not None:
        assert ring.data.dtype == dtype, "the ring holds the outputs' dtype"
        targets, slots = ring.claim_all(first, n_batches)
    else:
        targets = np.full(n_batches, -1, dtype=np.int64)
        slots = _fresh((0, len(fields), batch_size, seq), dtype).numpy()
    placed = (targets >= 0) | (offsets[1:] == offsets[:-1])  # no rows here: nothing to place
    overflow = _fresh((len(fields), len(rows) if not placed.all() else 0, seq), dtype)
    spill = overflow.numpy()
    positions_at = fields.index("position_ids") if "position_ids" in fields else -1
    ids_at = fields.index("document_ids") if "document_ids" in fields else -1
    if positions_at >= 0 or ids_at >= 0:
        assert pieces is not None, "the lines' input pieces come with position or document ids"
        lengths, piece_first, piece_counts = pieces.lengths, pieces.first, pieces.counts
        ids = pieces.ids if pieces.ids is not None else _NONE
        assert ids_at < 0 or pieces.ids is not None, "document ids requested"
    else:
        lengths = piece_first = piece_counts = ids = _NONE
    copy = pending if pending is not None else _NO_COPY
    outcome, span = _write_item(
        tokens, content, rows, np.arange(len(rows), dtype=np.int64), offsets, targets, slots,
        spill, IGNORE_INDEX, masked, positions_at, ids_at, lengths, piece_first, piece_counts, ids,
        pending is not None, copy.line_spans, copy.addresses, copy.sizes, copy.kinds,
        copy.span_source, copy.src, copy.dst, copy.n_copy, copy.limit,
    )  # fmt: skip
    if outcome != COPIED:
        copy.refuse(outcome, span)
    return placed, overflow if overflow.shape[1] else None


def _not_copying(outcome: int, span: int) -> None:
    raise AssertionError("nothing is copied without a pending copy")


# No pieces to copy: no lines' spans, seven empty span and buffer arrays.
_NO_COPY = PendingCopy(
    np.zeros(1, dtype=np.int64),
    _NONE,
    _NONE,
    _NONE,
    _NONE,
    _NONE,
    _NONE,
    _NONE,
    _INT32_MAX,
    [],
    _not_copying,
)


def _fresh(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor, in new shared memory in a DataLoader worker (as PyTorch's collate
    allocates its batches there: sending it is then no copy) unless it is empty."""
    n = int(np.prod(shape))
    if get_worker_info() is None or n == 0:
        return torch.empty(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(n * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)
