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

from fmsdata import batchwrite
from fmsdata.batchwrite import _stream_store
from fmsdata.compiled import compiled
from fmsdata.stages.outputs import IGNORE_INDEX


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
    batchwrite._shift(tokens, content, rows, out[0], out[1], IGNORE_INDEX)
    first = np.cumsum(counts) - counts
    batchwrite._positions(lengths, first, counts, rows, out[2])
    batchwrite._document_ids(lengths, first, counts, ids, rows, out[3])
    batchwrite._fence()
    np.testing.assert_array_equal(out, expected)


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


SHIFT_WITHOUT_JIT = """
import numpy as np
from fmsdata import batchwrite
from fmsdata.batchwrite import _stream_store
from fmsdata.compiled import compiled
tokens = np.arange(6, dtype=np.int32).reshape(2, 3)
out = np.zeros((2, 2, 2), dtype=np.int64)
batchwrite._shift(tokens, np.array([3, 2]), np.array([1, 0]), out[0], out[1], -100)
batchwrite._fence()
print(out.tolist())
"""


def test_the_kernels_run_in_python_under_numba_disable_jit():
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    run = subprocess.run(
        [sys.executable, "-c", SHIFT_WITHOUT_JIT], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str([[[3, 4], [0, 1]], [[4, -100], [1, 2]]])


@compiled
def _stores_with_an_intrinsic_of_another_module(row):
    _stream_store(row, 0, 1)


def test_an_intrinsic_is_called_only_from_its_own_module():
    with pytest.raises(TypeError, match="declare intrinsics in the module that calls them"):
        _stores_with_an_intrinsic_of_another_module(np.zeros(1, dtype=np.int64))
