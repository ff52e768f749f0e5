"""NarrowRows: what a worker's item carries comes back exactly, in fewer bytes."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fmsdata.narrowrows import NarrowRows

_DTYPES = st.sampled_from([np.int32, np.int64, np.uint16, np.uint32, np.int8])


@st.composite
def _arrays(draw):
    dtype = np.dtype(draw(_DTYPES))
    shape = (draw(st.integers(0, 40)), draw(st.integers(1, 6)))
    info = np.iinfo(dtype)
    # Columns of small values (the common case) beside ones reaching the type's ends.
    bound = draw(st.sampled_from([1, 127, 255, 40_000, 2**31 - 1, info.max]))
    low = max(info.min, -bound - 1)
    high = min(info.max, bound)
    return draw(hnp.arrays(dtype, shape, elements=st.integers(low, high)))


@settings(max_examples=200, deadline=None)
@given(_arrays())
def test_travels_exactly(array):
    rows = NarrowRows(array.copy())
    back = pickle.loads(pickle.dumps(rows))
    got = back.array
    assert got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(got, array)
    # Pickled twice (the worker keeps the item until it is sent): the same bytes.
    assert pickle.dumps(rows) == pickle.dumps(rows)


def test_small_columns_travel_narrow():
    rng = np.random.default_rng(0)
    n = 10_000
    spans = np.stack(
        [
            rng.integers(0, 2, n),  # dataset
            rng.integers(0, 32, n),  # file
            rng.integers(0, 5_000, n),  # document
            np.zeros(n, dtype=np.int64),  # start
            rng.integers(-4096, 4096, n),  # length, negated where it runs to the end
        ],
        axis=1,
    ).astype(np.int32)
    packed = len(pickle.dumps(NarrowRows(spans)))
    assert packed < (1 + 1 + 2 + 1 + 2) * n + 1_000  # against 20 bytes a row as int32
    assert np.array_equal(pickle.loads(pickle.dumps(NarrowRows(spans))).array, spans)


def test_a_column_needing_its_whole_type_keeps_it():
    array = np.array([[0, -(2**40)], [1, 2**40]], dtype=np.int64)
    back = pickle.loads(pickle.dumps(NarrowRows(array))).array
    assert np.array_equal(back, array) and back.dtype == np.int64


@pytest.mark.parametrize("bad", [np.zeros(4, dtype=np.int32), np.zeros((2, 2), dtype=float)])
def test_refuses_what_is_not_a_2d_integer_array(bad):
    with pytest.raises(TypeError, match="2-D integer array"):
        NarrowRows(bad)


def test_the_rows_are_read_only_once_wrapped():
    """Packed at the first pickle: a change after that would not travel, so none is let."""
    array = np.arange(6, dtype=np.int32).reshape(3, 2)
    rows = NarrowRows(array)
    with pytest.raises(ValueError, match="read-only"):
        array[0, 0] = 7
    back = pickle.loads(pickle.dumps(rows)).array
    with pytest.raises(ValueError, match="read-only"):
        back[0, 0] = 7
