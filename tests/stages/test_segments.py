"""Document pieces of every line at once, against a one-line-at-a-time model."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.stages.outputs import row_segment_lengths
from fmsdata.stages.spans import LENGTH, SPAN_WIDTH


def one_line(lengths, has_bol, has_eol, content, seq):
    pieces = list(lengths)
    pieces[0] += has_bol
    pieces[-1] += has_eol
    if content < seq + 1:
        pieces.append(seq + 1 - content)
    pieces[-1] -= 1
    return [p for p in pieces if p > 0]


@settings(max_examples=60)
@given(
    lines=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=6), min_size=1, max_size=8),
    has_bol=st.booleans(),
    has_eol=st.booleans(),
    pad=st.lists(st.integers(0, 4), min_size=8, max_size=8),
)
def test_pieces_of_every_line_match_one_line_at_a_time(lines, has_bol, has_eol, pad):
    # Lines of one length: the longest line fills it, the others are padded.
    contents = [sum(line) + has_bol + has_eol for line in lines]
    seq = max(contents) + max(pad) - 1
    arrays = []
    for line in lines:
        spans = np.zeros((len(line), SPAN_WIDTH), dtype=np.int64)
        spans[:, LENGTH] = line
        arrays.append(spans)
    flat, counts = row_segment_lengths(arrays, has_bol, has_eol, np.array(contents), seq)
    expected = [one_line(line, has_bol, has_eol, n, seq) for line, n in zip(lines, contents)]
    assert counts.tolist() == [len(pieces) for pieces in expected]
    assert flat.tolist() == [p for pieces in expected for p in pieces]
    assert all(sum(pieces) == seq for pieces in expected)
