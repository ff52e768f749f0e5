"""The compiled kernels against one-token-at-a-time references written without them."""

import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.stages import kernels
from fmsdata.stages.kernels import lay_out_lines, plan_hard_lines
from fmsdata.stages.spans import DLEN, LENGTH, SPAN_WIDTH, START
from fmsdata.util.compiled import compiled


def reference_rows(spans, counts, width, bol, eol, pad, bos, eos, documents):
    """Rows built one token at a time from the whole decorated documents."""
    rows, fills, i = [], [], 0
    for count in counts:
        row = [] if bol is None else [bol]
        for _ in range(count):
            doc = documents[i]
            decorated = ([] if bos is None else [bos]) + doc + ([] if eos is None else [eos])
            start, length = spans[i, START], spans[i, LENGTH]
            row += decorated[start : start + length]
            i += 1
        if eol is not None:
            row.append(eol)
        fills.append(len(row))
        rows.append(row + [pad] * (width - len(row)) if pad is not None else row)
    return rows, fills


@settings(max_examples=150, deadline=None)
@given(
    bos=st.sampled_from([None, 1]),
    eos=st.sampled_from([None, 2]),
    bol=st.sampled_from([None, 3]),
    eol=st.sampled_from([None, 4]),
    pad=st.sampled_from([None, 5]),
    data=st.data(),
)
def test_lay_out_lines_places_every_token_like_a_reference(bos, eos, bol, eol, pad, data):
    n_rows = data.draw(st.integers(1, 4))
    counts = [data.draw(st.integers(0, 4)) for _ in range(n_rows)]
    documents, spans = [], []
    extra = (bos is not None) + (eos is not None)
    for _ in range(sum(counts)):
        n = data.draw(st.integers(0, 12))
        documents.append(list(range(100 + 20 * len(documents), 100 + 20 * len(documents) + n)))
        dlen = n + extra
        start = data.draw(st.integers(0, dlen))
        length = data.draw(st.integers(0, dlen - start))
        span = np.zeros(SPAN_WIDTH, dtype=np.int64)
        span[START], span[LENGTH], span[DLEN] = start, length, dlen
        spans.append(span)
    spans = np.array(spans, dtype=np.int64).reshape(-1, SPAN_WIDTH)
    want, fills = reference_rows(spans, counts, 0, bol, eol, None, bos, eos, documents)
    width = max(fills) + data.draw(st.integers(0, 3)) if pad is not None else max(fills)
    want, fills = reference_rows(spans, counts, width, bol, eol, pad, bos, eos, documents)

    out = np.full((n_rows, width), -7, dtype=np.int32)
    dst, first, n_copy = (np.empty(len(spans), dtype=np.int64) for _ in range(3))

    def flag(token):
        return -1 if token is None else token

    fill = lay_out_lines(
        spans,
        np.array(counts, dtype=np.int64),
        out,
        flag(bol),
        flag(eol),
        flag(pad),
        flag(bos),
        flag(eos),
        dst,
        first,
        n_copy,
    )
    assert fill.tolist() == fills
    flat = out.reshape(-1)
    for i, doc in enumerate(documents):  # the document tokens, where the kernel said
        flat[dst[i] : dst[i] + n_copy[i]] = doc[first[i] : first[i] + n_copy[i]]
    for row, expected, n in zip(out.tolist(), want, fills):
        assert row[: len(expected)] == expected
        if pad is not None:  # without padding only full rows are valid (the writer checks)
            assert row[n:] == [pad] * (width - n)


def reference_hard_lines(rows, capacity):
    """Lines of exactly ``capacity`` tokens: every token of every row in turn, then the
    runs of one row within a line merged back into spans."""
    tokens = [(r, rows[r, START] + t) for r in range(len(rows)) for t in range(rows[r, LENGTH])]
    n_lines = len(tokens) // capacity
    lines = []
    for j in range(n_lines):
        spans = []
        for r, position in tokens[j * capacity : (j + 1) * capacity]:
            if spans and spans[-1][0] == r:
                spans[-1][2] += 1
            else:
                spans.append([r, position, 1])
        lines.append(spans)
    first_line = []
    at = 0
    for r in range(len(rows)):
        first_line.append(at // capacity)
        at += rows[r, LENGTH]
    carries = []
    for j in range(n_lines):
        cut = (j + 1) * capacity
        nxt = tokens[cut] if cut < len(tokens) else None
        row_of_last = tokens[cut - 1][0]
        if nxt is not None and nxt[0] == row_of_last:
            left = sum(1 for r, _ in tokens[cut:] if r == row_of_last)
            carries.append((row_of_last, nxt[1], left))
        else:
            carries.append(None)
    return lines, first_line, carries


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=15),
    capacity=st.integers(1, 25),
    carry_start=st.integers(0, 5),
)
def test_plan_hard_lines_matches_a_token_by_token_packing(lengths, capacity, carry_start):
    rows = np.zeros((len(lengths), SPAN_WIDTH), dtype=np.int64)
    rows[:, 0] = np.arange(len(lengths))  # a column the kernel only copies: which row
    rows[:, LENGTH] = lengths
    rows[0, START] = carry_start  # the first row may be a carried remainder
    spans, offsets, first_line, carries = plan_hard_lines(rows, capacity)
    lines, want_first, want_carries = reference_hard_lines(rows, capacity)

    assert len(offsets) == len(lines) + 1
    for j, line in enumerate(lines):
        got = spans[offsets[j] : offsets[j + 1]]
        assert [[int(s[0]), int(s[START]), int(s[LENGTH])] for s in got] == line
    assert first_line.tolist() == want_first
    for j, carry in enumerate(want_carries):
        if carry is None:
            assert carries[j, LENGTH] == 0
        else:
            assert (int(carries[j, 0]), int(carries[j, START]), int(carries[j, LENGTH])) == carry


def test_without_a_writable_cache_kernels_compile_in_memory_with_a_warning(monkeypatch, caplog):
    import numba

    real = numba.njit

    def no_cache(*args, **kwargs):
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available")
        return real(*args, **kwargs)

    from fmsdata.util import compiled as compiling

    monkeypatch.setattr(numba, "njit", no_cache)
    kernel = compiled(kernels.plan_hard_lines.func)
    rows = np.zeros((1, SPAN_WIDTH), dtype=np.int64)
    rows[0, LENGTH] = 5
    compiling._set_mode("foreground")  # compiled by this call (not in the background)
    try:
        with caplog.at_level(logging.WARNING, logger="fmsdata.util.compiled"):
            spans, offsets, _, _ = kernel(rows, 2)
    finally:
        compiling._set_mode(None)
    assert offsets.tolist() == [0, 1, 2]
    assert "cannot be cached on disk" in caplog.text and "NUMBA_CACHE_DIR" in caplog.text


CACHED_RUN = textwrap.dedent(
    """
    import numpy as np
    from fmsdata.stages import kernels
    from fmsdata.stages.spans import LENGTH, SPAN_WIDTH

    rows = np.zeros((1, SPAN_WIDTH), dtype=np.int64)
    rows[0, LENGTH] = 5
    kernels.plan_hard_lines(rows, 2)
    # A kernel that calls intrinsics (non-temporal stores) is cached the same way.
    from fmsdata.transport import batchwrite

    tokens = np.zeros((1, 3), dtype=np.int32)
    out = np.zeros((2, 1, 2), dtype=np.int64)
    ones = np.ones(1, dtype=np.int64)
    batchwrite._shift(tokens, ones, ones - 1, out[0], out[1], -100, 0)
    # And one that reads memory by address and inlines a helper (the piece copy).
    source = np.arange(4, dtype=np.uint16)
    address = np.array([source.__array_interface__["data"][0]], dtype=np.int64)
    batchwrite.copy_spans(
        address, np.array([4]), np.array([2]), ones - 1, ones, ones - 1, ones, 0, 1,
        tokens.reshape(-1), 2**31 - 1,
    )
    assert tokens.tolist() == [[1, 0, 0]]
    kernels_run = (kernels.plan_hard_lines, batchwrite._shift, batchwrite.copy_spans)
    for kernel in kernels_run:
        stats = kernel.dispatcher.stats
        print(stats.cache_path, sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))
    """
)


@pytest.mark.slow  # two fresh interpreters
def test_numba_cache_dir_holds_the_compiled_code_and_a_second_process_reuses_it(tmp_path):
    # Compiled by each first call: the process reads the dispatchers' cache statistics.
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "FMSDATA_COMPILE": "foreground"}
    runs = [
        subprocess.run([sys.executable, "-c", CACHED_RUN], env=env, capture_output=True, text=True)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (run.stdout.split() for run in runs)
    for k in range(3):  # each kernel: path, hits, misses
        first_path, first_hits, first_misses = first[3 * k : 3 * k + 3]
        assert first_path.startswith(str(tmp_path))
        assert (first_hits, first_misses) == ("0", "1")  # compiled, then written
        assert second[3 * k + 1 : 3 * k + 3] == ["1", "0"]  # loaded, not compiled
    assert any(name.endswith(".nbc") for _, _, names in os.walk(tmp_path) for name in names)


@compiled
def _doubled(values):
    return 2 * values


@compiled
def _doubled_sum(values):
    total = 0
    for v in _doubled(values):
        total += v
    return total


def test_a_compiled_function_calls_the_compiled_helpers_it_names():
    """numba calls a helper's dispatcher; Python callers still see the lazy wrapper."""
    values = np.arange(5, dtype=np.int64)
    assert _doubled_sum(values) == 20
    assert np.array_equal(_doubled(values), 2 * values)
