"""A worker's rows written as the final batch tensors, where the main process hands them out.

The worker turns its packed int32 lines into the outputs of the causal-LM step in one
compiled pass per output: ``input_ids`` (the line less its last token) and ``labels`` (less
its first, ``IGNORE_INDEX`` from a padded line's last content token on), widened to int64,
and on request ``position_ids`` (restarting at each piece of a document) and
``document_ids``. Each row goes to its canonical row of the batch, in the batch's ring slot
(``fmsdata.batchring``) or, where that slot is still held, in fresh memory sent with the
item: the main process hands them out without reading a token.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from fmsdata.batchring import BatchRing
from fmsdata.compiled import compiled, intrinsic
from fmsdata.stages.outputs import IGNORE_INDEX

__all__ = ["RowPieces", "token_fields", "write_batches"]


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
def _shift(tokens, content, rows, inputs, labels, ignore):  # type: ignore[no-untyped-def]
    """Row ``i`` of ``tokens`` into row ``rows[i]`` of ``inputs`` and ``labels``."""
    seq = inputs.shape[1]
    for i in range(tokens.shape[0]):
        into, label = inputs[rows[i]], labels[rows[i]]
        keep = min(max(content[i] - 1, 0), seq)
        for j in range(seq):
            _stream_store(into, j, np.int64(tokens[i, j]))
        for j in range(keep):
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


def _write(
    out: np.ndarray,
    fields: tuple[str, ...],
    tokens: np.ndarray,
    content: np.ndarray,
    pieces: RowPieces | None,
    lines: slice,
    rows: np.ndarray,
) -> None:
    """Lines ``lines`` of the item into rows ``rows`` of ``out`` ``[fields, rows, seq]``."""
    _shift(tokens[lines], content[lines], rows, out[0], out[1], IGNORE_INDEX)
    if pieces is None:
        return
    first, counts = pieces.first[lines], pieces.counts[lines]
    for f, name in enumerate(fields[2:], 2):
        if name == "position_ids":
            _positions(pieces.lengths, first, counts, rows, out[f])
        else:
            assert pieces.ids is not None, "document ids requested"
            _document_ids(pieces.lengths, first, counts, pieces.ids, rows, out[f])


def write_batches(
    ring: BatchRing | None,
    first: int,
    fields: tuple[str, ...],
    offsets: np.ndarray,
    rows: np.ndarray,
    tokens: np.ndarray,
    content: np.ndarray,
    pieces: RowPieces | None,
) -> tuple[np.ndarray, torch.Tensor | None]:
    """Write an item's lines as batches ``first``, ``first + 1``, ...

    Batch ``k`` holds the item's lines ``offsets[k]:offsets[k + 1]`` at rows ``rows`` of
    the batch. Returns which batches went to their ring slot and, for the others, the
    fresh ``[fields, lines, seq]`` tensor holding their lines in item order (shared memory
    in a worker: it travels by handle, not by copy).
    """
    n_batches = len(offsets) - 1
    placed = np.zeros(n_batches, dtype=bool)
    overflow: torch.Tensor | None = None
    seq = tokens.shape[1] - 1
    for k in range(n_batches):
        a, b = int(offsets[k]), int(offsets[k + 1])
        slot = ring.claim(first + k) if ring is not None and b > a else None
        placed[k] = slot is not None or b == a  # no rows of this worker: nothing to place
        if slot is not None:
            _write(slot, fields, tokens, content, pieces, slice(a, b), rows[a:b])
        elif b > a:
            if overflow is None:
                overflow = _fresh((len(fields), len(rows), seq))
            local = np.arange(a, b, dtype=np.int64)
            _write(overflow.numpy(), fields, tokens, content, pieces, slice(a, b), local)
    _fence()  # the batches are written before the item that says so is sent
    return placed, overflow


def _fresh(shape: tuple[int, ...]) -> torch.Tensor:
    """An int64 tensor, in new shared memory in a DataLoader worker (as PyTorch's collate
    allocates its batches there: sending it is then no copy)."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch.int64)
    n = int(np.prod(shape))
    storage = torch.UntypedStorage._new_shared(n * 8)
    return torch.empty(0, dtype=torch.int64).set_(storage).view(shape)
