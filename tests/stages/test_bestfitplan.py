"""The compiled best-fit plan against a one-at-a-time model (``bestfitmodel``), run compiled
and as Python, and the rule's promises checked on its output directly."""

import numpy as np
import pytest
from bestfitmodel import best_fit_windows
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.stages.bestfitplan import (
    STAT_CUT,
    STAT_LINES,
    STAT_PADDING,
    STAT_PIECES,
    plan_best_fit,
)
from fmsdata.stages.spans import DLEN, DOC, LENGTH, SPAN_WIDTH, START
from fmsdata.util import compiled


def rows_of(pieces):
    rows = np.zeros((len(pieces), SPAN_WIDTH), dtype=np.int64)
    for k, (name, start, length) in enumerate(pieces):
        rows[k, DOC], rows[k, START], rows[k, LENGTH], rows[k, DLEN] = name, start, length, -1
    return rows


def planned(docs, window, capacity, open_lines=()):
    """The plan's windows in the model's terms."""
    flat = [piece for line in open_lines for piece in line]
    offsets = np.cumsum([0] + [len(line) for line in open_lines]).astype(np.int64)
    spans, line_offsets, window_lines, open_spans, open_offsets, window_open, stats = plan_best_fit(
        rows_of(flat), offsets, rows_of([(n, 0, length) for n, length in docs]), window, capacity
    )

    def lines(rows, bounds, first, end):
        return [
            [(int(s[DOC]), int(s[START]), int(s[LENGTH])) for s in rows[bounds[j] : bounds[j + 1]]]
            for j in range(first, end)
        ]

    out = []
    for w in range(len(window_lines) - 1):
        emitted = lines(spans, line_offsets, window_lines[w], window_lines[w + 1])
        assert stats[w, STAT_LINES] == len(emitted)
        assert stats[w, STAT_PIECES] == sum(map(len, emitted))
        out.append(
            {
                "lines": emitted,
                "open": lines(open_spans, open_offsets, window_open[w], window_open[w + 1]),
                "cut": int(stats[w, STAT_CUT]),
                "padding": int(stats[w, STAT_PADDING]),
            }
        )
    return out


@pytest.fixture(params=["foreground", "python"])
def mode(request):
    compiled._set_mode(request.param)
    yield request.param
    compiled._set_mode(None)


@st.composite
def packings(draw):
    capacity = draw(st.integers(1, 40))
    window = draw(st.integers(1, 12))
    n = window * draw(st.integers(0, 5)) + draw(st.integers(0, window - 1))
    lengths = draw(st.lists(st.integers(1, 3 * capacity + 2), min_size=n, max_size=n))
    docs = [(100 + i, length) for i, length in enumerate(lengths)]
    open_lines, fill, name = [], 0, 1000  # lines left open by an earlier window
    for _ in range(draw(st.integers(0, 3))):
        room = capacity - 1
        line = []
        for _ in range(draw(st.integers(1, 3))):
            if room < 1:
                break
            length = draw(st.integers(1, room))
            start = draw(st.integers(0, 5))
            line.append((name, start, length))
            name, room, fill = name + 1, room - length, fill + length
        open_lines.append(line)
    return docs, window, capacity, open_lines


@settings(max_examples=150, deadline=None)
@given(case=packings())
def test_the_plan_is_the_models(mode, case):
    docs, window, capacity, open_lines = case
    assert planned(docs, window, capacity, open_lines) == best_fit_windows(
        docs, window, capacity, open_lines
    )


@settings(max_examples=100, deadline=None)
@given(case=packings())
def test_only_documents_longer_than_a_line_are_cut_and_only_at_line_ends(mode, case):
    docs, window, capacity, open_lines = case
    windows = planned(docs, window, capacity, open_lines)
    carried = {piece[0] for line in open_lines for piece in line}
    emitted: dict[int, list[tuple[int, int]]] = {}
    for w, out in enumerate(windows):
        own = {name for name, _ in docs[w * window : (w + 1) * window]}
        for line in out["lines"]:
            assert sum(length for _, _, length in line) <= capacity
            for name, start, length in line:
                if name not in carried:
                    emitted.setdefault(name, []).append((start, length))
        for line in out["open"]:
            assert sum(length for _, _, length in line) < capacity
            assert {name for name, _, _ in line} <= own  # open lines hold this window's only
    still_open = {name for line in windows[-1]["open"] for name, _, _ in line} if windows else set()
    whole = len(docs) // window * window
    for name, length in docs[:whole]:
        if name in still_open:
            continue  # its last piece waits in a line left open
        pieces = sorted(emitted[name])
        assert sum(n for _, n in pieces) == length  # every token once
        if length <= capacity:
            assert pieces == [(0, length)]  # never cut
        else:
            assert [start for start, _ in pieces] == list(range(0, length, capacity))
    assert not {name for name, _ in docs[whole:]} & set(emitted)  # no part-window placed


def test_a_line_left_open_fills_in_the_next_window_then_is_emitted(mode):
    """Window 1 opens a line of 6 of 10 tokens; window 2's 4-token document fills it best
    (better than its own new line), and the line, carried in, is emitted after window 2
    whatever its room."""
    windows = planned([(1, 6), (2, 7), (3, 4), (4, 1)], 2, 10)
    assert windows[0]["lines"] == []
    assert windows[0]["open"] == [[(1, 0, 6)], [(2, 0, 7)]]
    assert windows[1]["lines"] == [[(1, 0, 6), (3, 0, 4)], [(2, 0, 7), (4, 0, 1)]]
    assert windows[1]["open"] == [] and windows[1]["padding"] == 2


def test_a_long_document_is_full_lines_then_its_rest_placed_as_a_document(mode):
    windows = planned([(1, 25), (2, 3)], 2, 10)
    assert windows[0]["lines"] == [[(1, 0, 10)], [(1, 10, 10)]]
    assert windows[0]["open"] == [[(1, 20, 5), (2, 0, 3)]]
    assert windows[0]["cut"] == 1


def test_an_empty_run_of_documents_plans_nothing(mode):
    assert planned([], 4, 10) == []
    assert planned([(1, 3)], 4, 10) == []
