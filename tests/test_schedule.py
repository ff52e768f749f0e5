"""ShareTargets.clock_at, compiled, against the numpy formula it replaced (the mix's order
depends on every bit of these clocks: equal, not close)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.stages.schedule import WeightSchedule


def reference_clock_at(targets, d, tokens):
    """The numpy formula the compiled pass replaced, kept here as the model."""
    tokens = np.asarray(tokens, dtype=np.float64)
    k = np.searchsorted(targets.reached[1:, d], tokens, side="right")
    out = np.full(tokens.shape, np.inf)
    ok = k < len(targets.starts)
    piece = k[ok]
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero share: inf or nan
        out[ok] = (
            targets.starts[piece]
            + (tokens[ok] - targets.reached[piece, d]) / targets.shares[piece, d]
        )
    return out


weights_row = st.lists(st.integers(0, 5), min_size=3, max_size=3).filter(any)


@st.composite
def schedules(draw):
    points = draw(st.integers(1, 4))
    clocks = sorted(draw(st.sets(st.integers(0, 10_000), min_size=points, max_size=points)))
    rows = [draw(weights_row) for _ in clocks]
    if points == 1:
        return WeightSchedule.constant(rows[0])
    linear = draw(st.booleans())
    return WeightSchedule(
        tuple(float(c) for c in clocks),
        tuple(tuple(float(w) for w in r) for r in rows),
        linear,
        draw(st.integers(1, 7)),
    )


@settings(max_examples=300, deadline=None)
@given(
    schedules(),
    st.lists(st.integers(0, 3_000), min_size=3, max_size=3),
    st.lists(st.integers(0, 60_000), max_size=30),
    st.integers(0, 2),
)
def test_compiled_clocks_equal_the_numpy_formula(schedule, base, counts, d):
    targets = schedule.targets(base)
    # The counts drawn, and each target a piece reaches (ties at the bounds) and its
    # neighbours.
    bounds = [v for v in targets.reached[:, d] if np.isfinite(v)]
    tokens = np.asarray(
        counts + [int(v) + e for v in bounds for e in (-1, 0, 1) if int(v) + e >= 0],
        dtype=np.int64,
    )
    got = targets.clock_at(d, tokens)
    want = reference_clock_at(targets, d, tokens)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.int64), want.view(np.int64))  # bit for bit, infs too


def test_a_scalar_count_gives_a_scalar_clock():
    targets = WeightSchedule.constant([1.0, 3.0]).targets([0, 0])
    got = targets.clock_at(1, 300)
    assert got.shape == () and float(got) == 400.0
    assert np.isinf(WeightSchedule.constant([1.0, 0.0]).targets([0, 0]).clock_at(1, 0))


def test_a_dataset_out_of_range_is_refused():
    """The compiled pass reads without bounds checks: the index is checked before it."""
    targets = WeightSchedule.constant([1.0, 3.0]).targets([0, 0])
    with pytest.raises(IndexError):
        targets.clock_at(2, [1, 2])
