"""The batch-writing kernels (non-temporal stores) against a numpy reference."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.stages.outputs import IGNORE_INDEX
from fmsdata.transport import batchwrite
from fmsdata.transport.batchring import BatchRing
from fmsdata.transport.batchwrite import (
    COPIED,
    PIECE_OUT_OF_BOUNDS,
    TOKEN_OUT_OF_RANGE,
    PendingCopy,
    RowPieces,
    _stream_store,
    copy_spans,
    source_kind,
    write_batches,
)
from fmsdata.util.compiled import compiled

DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64]


def reference(tokens, content, rows, n_rows, lengths, counts, ids):
    """inputs, labels, position ids and document ids of each line at its row, by numpy."""
    n, width = tokens.shape
    seq = width - 1
    out = np.full((4, n_rows, seq), 7, dtype=np.int64)  # rows not written keep their 7s
    first = np.cumsum(counts) - counts
    for i in range(n):
        r = rows[i]
        out[0, r] = tokens[i, :-1]
        keep = min(max(content[i] - 1, 0), seq)
        out[1, r] = IGNORE_INDEX
        out[1, r, :keep] = tokens[i, 1 : keep + 1]
        mine = slice(first[i], first[i] + counts[i])
        out[2, r] = np.concatenate([np.arange(n) for n in lengths[mine]])
        out[3, r] = np.repeat(ids[mine], lengths[mine])
    return out


@st.composite
def lines(draw):
    seq = draw(st.integers(1, 40))
    n = draw(st.integers(0, 6))
    n_rows = n + draw(st.integers(0, 3))
    rows = np.array(draw(st.permutations(range(n_rows)))[:n], dtype=np.int64)
    tokens = np.array(
        draw(st.lists(st.integers(0, 2**31 - 1), min_size=n * (seq + 1), max_size=n * (seq + 1))),
        dtype=np.int32,
    ).reshape(n, seq + 1)
    content = np.array([draw(st.integers(0, seq + 1)) for _ in range(n)], dtype=np.int64)
    lengths, counts = [], []
    for _ in range(n):  # each line's input pieces, summing to seq
        cuts = sorted(
            draw(st.lists(st.integers(1, seq - 1), max_size=4, unique=True)) if seq > 1 else []
        )
        piece = np.diff([0, *cuts, seq])
        lengths.extend(piece.tolist())
        counts.append(len(piece))
    ids = np.array(
        draw(st.lists(st.integers(-1, 10**12), min_size=len(lengths), max_size=len(lengths))),
        dtype=np.int64,
    )
    return (
        tokens,
        content,
        rows,
        n_rows,
        np.array(lengths, dtype=np.int64),
        np.array(counts, dtype=np.int64),
        ids,
    )


@settings(max_examples=150, deadline=None)
@given(lines())
def test_kernels_write_what_numpy_writes(case):
    tokens, content, rows, n_rows, lengths, counts, ids = case
    expected = reference(tokens, content, rows, n_rows, lengths, counts, ids)
    out = np.full_like(expected, 7)
    batchwrite._shift(tokens, content, rows, out[0], out[1], IGNORE_INDEX, 0)
    first = np.cumsum(counts) - counts
    batchwrite._positions(lengths, first, counts, rows, out[2])
    batchwrite._document_ids(lengths, first, counts, ids, rows, out[3])
    batchwrite._fence()
    np.testing.assert_array_equal(out, expected)


@settings(max_examples=100, deadline=None)
@given(lines(), st.integers(0, 9))
def test_int32_labels_with_the_first_ignored_are_numpys_int64_ones_cast(case, masked):
    """``output_dtype="int32"`` and ``ignore_first_labels``: the int64 outputs cast, with
    each row's first ``masked`` labels (those within its content) set to the ignore id."""
    tokens, content, rows, n_rows, lengths, counts, ids = case
    expected = reference(tokens, content, rows, n_rows, lengths, counts, ids)[:2]
    for i, row in enumerate(rows):
        expected[1, row, : max(0, min(masked, content[i] - 1))] = IGNORE_INDEX
    out = np.full(expected.shape, 7, dtype=np.int32)
    batchwrite._shift(tokens, content, rows, out[0], out[1], IGNORE_INDEX, masked)
    batchwrite._fence()
    np.testing.assert_array_equal(out, expected.astype(np.int32))


def test_called_from_python_an_intrinsic_does_what_it_compiles_to():
    row = np.zeros(3, dtype=np.int64)
    batchwrite._stream_store(row, 1, -100)
    batchwrite._store_fence()
    assert row.tolist() == [0, -100, 0]


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 only")
def test_the_fence_after_streaming_stores_is_an_sfence_on_x86():
    import numba

    # Compiled afresh: code loaded from numba's disk cache has no assembly to show.
    fence = numba.njit(batchwrite._fence._with_compiled_helpers())
    fence()
    assert "sfence" in "".join(fence.inspect_asm().values())


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 only")
def test_the_copy_asks_for_the_pieces_ahead():
    import numba

    # Compiled afresh, as above; a prefetch that LLVM dropped would slow the copy silently.
    copy = numba.njit(copy_spans._with_compiled_helpers())
    z = np.zeros(1, dtype=np.int64)
    copy(z, z, z, z, z, z, z, 0, 0, np.zeros(1, dtype=np.int32), 0)
    assert "prefetcht0" in "".join(copy.inspect_asm().values())


SHIFT_WITHOUT_JIT = """
import numpy as np
from fmsdata.transport import batchwrite
from fmsdata.transport.batchwrite import _stream_store
from fmsdata.util.compiled import compiled
tokens = np.arange(6, dtype=np.int32).reshape(2, 3)
out = np.zeros((2, 2, 2), dtype=np.int64)
batchwrite._shift(tokens, np.array([3, 2]), np.array([1, 0]), out[0], out[1], -100, 0)
batchwrite._fence()
print(out.tolist())
# The copy reads its buffers by address, asking for pieces ahead (Python: ctypes, no-op).
source = np.array([7, 8, 9, 300], dtype=np.uint16)
address = np.array([source.__array_interface__["data"][0]], dtype=np.int64)
rows = np.zeros(5, dtype=np.int32)
spans = [np.array(v, dtype=np.int64) for v in ([0] * 8, [1, 0, 2, 0, 0, 3, 0, 0], [2] * 8)]
outcome = batchwrite.copy_spans(
    address, np.array([4]), np.array([2]), spans[0], spans[1], spans[0] + [0, 3, 0, 0, 0, 0, 0, 0],
    spans[2], 0, 2, rows, 2**31 - 1,
)
print(outcome, rows.tolist())
outcome = batchwrite.copy_spans(
    address, np.array([4]), np.array([2]), spans[0], spans[1], spans[0], spans[2], 2, 3, rows, 200
)
print(outcome)
"""


def test_the_kernels_run_in_python_under_numba_disable_jit():
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    run = subprocess.run(
        [sys.executable, "-c", SHIFT_WITHOUT_JIT], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    shifted, copied, refused = run.stdout.strip().split("\n")
    assert shifted == str([[[3, 4], [0, 1]], [[4, -100], [1, 2]]])
    assert copied == "(0, -1) [8, 9, 0, 7, 8]"
    assert refused == "(1, 2)"  # 300 is past the limit of 200


@compiled
def _stores_with_an_intrinsic_of_another_module(row):
    _stream_store(row, 0, 1)


def test_an_intrinsic_is_called_only_from_its_own_module():
    with pytest.raises(TypeError, match="declare intrinsics in the module that calls them"):
        _stores_with_an_intrinsic_of_another_module(np.zeros(1, dtype=np.int64))


def reference_copy(sources, span_source, src, dst, n_copy, spans, out, limit):
    """What copy_spans must do, token by token; returns (outcome, span) the same way."""
    for i in spans:
        f, n = span_source[i], n_copy[i]
        if n == 0 or f < 0:
            continue
        source = sources[f]
        if src[i] < 0 or src[i] + n > len(source) or dst[i] < 0 or dst[i] + n > len(out):
            return PIECE_OUT_OF_BOUNDS, i
        values = [int(v) for v in source[src[i] : src[i] + n]]
        out[dst[i] : dst[i] + n] = np.array(values, dtype=np.int64).astype(np.int32)  # wraps
        if not all(0 <= v <= limit for v in values):
            return TOKEN_OUT_OF_RANGE, i
    return COPIED, -1


@st.composite
def span_sources(draw, n_spans=None):
    """Token buffers of mixed dtypes (as one item reads many files) and spans of them:
    ``(sources, span_source, src, n_copy)``; values sometimes outside an int32 row."""
    sources = []
    for _ in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from(DTYPES))
        info = np.iinfo(dtype)
        big = draw(st.booleans())
        high = min(int(info.max), 2**31 + 5 if big else 2**31 - 1)
        low = max(int(info.min), -3 if big else 0)
        size = draw(st.integers(0, 60))
        value = st.one_of(st.integers(low, high), st.sampled_from([low, high]))  # edges often
        values = draw(st.lists(value, min_size=size, max_size=size))
        raw = np.array(values, dtype=dtype).tobytes()
        # Read-only, as memory-mapped buffers are; sometimes at an odd address (an MDS
        # sample's tokens may start at any byte).
        skew = draw(st.sampled_from([0, 1]))
        buffer = np.frombuffer(b"\0" * skew + raw, dtype=dtype, offset=skew)
        sources.append(buffer)
    if n_spans is None:
        n_spans = draw(st.integers(0, 10))
    span_source = [draw(st.integers(-1, len(sources) - 1)) for _ in range(n_spans)]
    # Pieces start anywhere, also past the end of their file (refused), and may be empty.
    src = [draw(st.integers(-1, len(sources[f]) + 2)) for f in span_source]
    n_copy = [draw(st.integers(0, 25)) for _ in range(n_spans)]
    as_int = lambda values: np.array(values, dtype=np.int64)  # noqa: E731
    return sources, as_int(span_source), as_int(src), as_int(n_copy)


def addresses_of(sources):
    return (
        np.array([s.__array_interface__["data"][0] for s in sources], dtype=np.int64),
        np.array([len(s) for s in sources], dtype=np.int64),
        np.array([source_kind(s) for s in sources], dtype=np.int64),
    )


@settings(max_examples=200, deadline=None)
@given(case=span_sources(), limit=st.sampled_from([2**31 - 1, 200, 0]), data=st.data())
def test_copy_spans_matches_a_token_by_token_copy(case, limit, data):
    sources, span_source, src, n_copy = case
    dst = np.concatenate([[0], np.cumsum(n_copy)[:-1]]).astype(np.int64)
    if len(dst) and data.draw(st.booleans()):  # a piece that runs past the rows
        dst[-1] += data.draw(st.integers(1, 5))
    room = int(n_copy.sum())
    begin = data.draw(st.integers(0, len(n_copy)))
    end = data.draw(st.integers(begin, len(n_copy)))
    got = np.full(room, -7, dtype=np.int32)
    outcome = copy_spans(
        *addresses_of(sources), span_source, src, dst, n_copy, begin, end, got, limit
    )
    want = np.full(room, -7, dtype=np.int32)
    expected = reference_copy(
        sources, span_source, src, dst, n_copy, range(begin, end), want, limit
    )
    assert outcome == expected
    if outcome[0] == COPIED:
        np.testing.assert_array_equal(got, want)


def test_source_kind_takes_native_contiguous_integers_only():
    assert [source_kind(np.zeros(2, dtype=t)) for t in DTYPES] == list(range(8))
    assert source_kind(np.zeros(2, dtype=">u2")) == -1  # byte-swapped
    assert source_kind(np.zeros(4, dtype=np.uint16)[::2]) == -1  # strided
    assert source_kind(np.zeros(2, dtype=np.float32)) == -1
    assert source_kind(np.zeros(2, dtype=np.bool_)) == -1  # one byte, not an integer
    assert source_kind(np.zeros(2, dtype=np.float64)) == -1  # eight bytes, not an integer
    assert source_kind(np.zeros((2, 2), dtype=np.int32)) == -1  # two-dimensional
    # int64 and uint64 under their other C names (long long) are the same kinds
    assert source_kind(np.zeros(2, dtype=np.longlong)) == 7
    assert source_kind(np.zeros(2, dtype=np.ulonglong)) == 6


@st.composite
def items(draw):
    """An item: lines laid out for pieces of several buffers, cut into batches, with some
    batches' ring slots still held."""
    seq = draw(st.integers(1, 12))
    width = seq + 1
    batch_size = draw(st.integers(1, 4))
    n_batches = draw(st.integers(1, 5))
    sizes = [draw(st.integers(0, batch_size)) for _ in range(n_batches)]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n_lines = int(offsets[-1])
    rows = np.concatenate(
        [np.array(draw(st.permutations(range(batch_size)))[:n], dtype=np.int64) for n in sizes]
    )
    # Each line: pieces back to back from its second token on (the first is a delimiter).
    counts = [draw(st.integers(0, 3)) for _ in range(n_lines)]
    sources, span_source, src, _ = draw(span_sources(n_spans=sum(counts)))
    n_copy, dst, i = np.zeros(len(src), dtype=np.int64), np.zeros(len(src), dtype=np.int64), 0
    for line, count in enumerate(counts):
        at = line * width + 1
        for _ in range(count):
            n_copy[i] = draw(st.integers(0, max(0, (line + 1) * width - at)))
            dst[i], at, i = at, at + n_copy[i], i + 1
    line_spans = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    content = np.array([draw(st.integers(0, width)) for _ in range(n_lines)], dtype=np.int64)
    held = [draw(st.booleans()) for _ in range(n_batches)]
    lengths, piece_counts = [], []
    for _ in range(n_lines):  # each line's input pieces, summing to seq
        cut_at = st.integers(1, max(1, seq - 1))
        cuts = sorted(draw(st.lists(cut_at, max_size=3 if seq > 1 else 0, unique=True)))
        piece = np.diff([0, *cuts, seq])
        lengths.extend(piece.tolist())
        piece_counts.append(len(piece))
    ids = [draw(st.integers(-1, 10**6)) for _ in lengths]
    as_int = lambda values: np.array(values, dtype=np.int64)  # noqa: E731
    return dict(
        seq=seq, batch_size=batch_size, offsets=offsets, rows=rows, sources=sources,
        span_source=span_source, src=src, dst=dst, n_copy=n_copy, line_spans=line_spans,
        content=content, held=held, lengths=as_int(lengths), piece_counts=as_int(piece_counts),
        ids=as_int(ids), with_ids=draw(st.booleans()), ring=draw(st.booleans()),
    )  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(item=items(), limit=st.sampled_from([2**31 - 1, 300]), first=st.integers(0, 20))
def test_write_batches_copies_each_batch_as_it_writes_it(item, limit, first):
    """The pieces copied a batch at a time, then the batches written to their slots or to
    fresh memory: the same batches as copying all the rows first (token by token), and
    for a copy that stops, the error for that span."""
    seq, batch_size, offsets = item["seq"], item["batch_size"], item["offsets"]
    n_lines, n_batches = int(offsets[-1]), len(offsets) - 1
    fields = ("input_ids", "labels")
    pieces = None
    if item["with_ids"]:
        fields += ("position_ids", "document_ids")
        pieces = RowPieces(item["lengths"], item["piece_counts"], item["ids"])
    args = (item["span_source"], item["src"], item["dst"], item["n_copy"])
    want_rows = np.full((n_lines, seq + 1), 5, dtype=np.int32)
    expected = reference_copy(
        item["sources"], *args, range(len(item["src"])), want_rows.reshape(-1), limit
    )
    ring = BatchRing(n_batches + 1, fields, batch_size, seq, shared=False)
    ring.restart(first)  # numbers the slots from ``first``... on
    start = ring.position
    held = item["held"] if item["ring"] else [True] * n_batches  # no ring: all fresh
    for k, is_held in enumerate(held):
        if is_held:  # the slot still holds an earlier batch
            ring._free[(start + k) % ring.slots] = start + k - ring.slots
    refused = []
    pending = PendingCopy(
        item["line_spans"], *addresses_of(item["sources"]), *args, limit=limit,
        buffers=item["sources"], refuse=lambda outcome, span: refused.append((outcome, span)),
    )  # fmt: skip
    rows = np.full((n_lines, seq + 1), 5, dtype=np.int32)
    placed, overflow = write_batches(
        ring if item["ring"] else None, start, fields, offsets, item["rows"], rows,
        item["content"], pieces, pending,
    )  # fmt: skip
    if expected[0] != COPIED:
        assert refused == [expected]
        return
    assert refused == []
    np.testing.assert_array_equal(rows, want_rows)
    want = reference(
        want_rows, item["content"], np.arange(n_lines), n_lines,
        item["lengths"], item["piece_counts"], item["ids"],
    )[: len(fields)]  # fmt: skip
    for k in range(n_batches):
        a, b = int(offsets[k]), int(offsets[k + 1])
        assert placed[k] == (not held[k] or a == b)
        if a == b:
            continue
        if placed[k]:
            got = ring.data.numpy()[(start + k) % ring.slots][:, item["rows"][a:b]]
        else:
            got = overflow.numpy()[:, a:b]
        np.testing.assert_array_equal(got, want[:, a:b])
