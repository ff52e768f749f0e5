import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stagecheck import check_stage_rescale, check_stage_resume
from support import accesses, corpus, scratch_dir

from fmsdata.stages.documents import Decoration, RandomWalk
from fmsdata.stages.mixing import TokenShareMixer
from fmsdata.stages.packing import LinePacker
from fmsdata.stages.schedule import WeightSchedule
from fmsdata.stages.spans import DLEN, LENGTH, START


def packer(info, capacity, mode="hard", weights=None, seed=1):
    acc = accesses(info)
    streams = [RandomWalk(a, 0, 1, seed, Decoration(bos=1, eos=2)) for a in acc]
    mixer = TokenShareMixer(
        streams, list(info.ranges), WeightSchedule.constant(weights or [1.0] * len(acc))
    )
    return LinePacker(mixer, capacity, mode)


def pieces(lines):
    """Concatenated (ds, file, doc, start, length) pieces with adjacent pieces of one
    document merged: the document stream as the packer saw it."""
    merged = []
    for line in lines:
        for ds, f, d, s, n, dlen, _ in line.tolist():
            if merged and merged[-1][:3] == (ds, f, d) and merged[-1][3] + merged[-1][4] == s:
                merged[-1] = (*merged[-1][:4], merged[-1][4] + n, dlen)
            else:
                merged.append((ds, f, d, s, n, dlen))
    return merged


@settings(max_examples=20)
@given(capacity=st.integers(1, 300), mean=st.integers(1, 200), seed=st.integers(0, 100))
def test_hard_packing_fills_every_line_and_loses_nothing(capacity, mean, seed):
    info = corpus(scratch_dir(), {"a": 2, "b": 1}, docs_per_file=25, mean_length=mean)
    p = packer(info, capacity, seed=seed)
    lines = [next(p) for _ in range(40)]
    assert all(int(line[:, LENGTH].sum()) == capacity for line in lines)
    docs = pieces(lines)
    # Whole documents in order, each from its start; only the last may be unfinished.
    for _, _, _, s, n, dlen in docs[:-1]:
        assert s == 0 and n == dlen
    assert docs[-1][3] == 0


@settings(max_examples=20)
@given(capacity=st.integers(4, 300), mean=st.integers(1, 200), seed=st.integers(0, 100))
def test_pad_packing_splits_only_documents_longer_than_a_line(capacity, mean, seed):
    info = corpus(scratch_dir(), {"a": 2}, docs_per_file=25, mean_length=mean)
    p = packer(info, capacity, mode="pad", seed=seed)
    lines = [next(p) for _ in range(40)]
    for line in lines:
        assert 0 < int(line[:, LENGTH].sum()) <= capacity
    for _, _, _, s, n, dlen in pieces(lines)[:-1]:
        assert s == 0 and n == dlen
    for line in lines:
        for row in line[1:]:
            # A document that does not open the line is in it whole.
            assert row[START] == 0 and row[LENGTH] == row[DLEN]


def test_pad_packing_never_leaves_room_for_the_next_document(tmp_path):
    info = corpus(tmp_path, {"a": 2}, docs_per_file=50, mean_length=20)
    p = packer(info, 64, mode="pad")
    lines = [next(p) for _ in range(60)]
    for line, nxt in zip(lines, lines[1:]):
        free = 64 - int(line[:, LENGTH].sum())
        if nxt[0, START] == 0:  # next line starts a fresh document
            assert nxt[0, DLEN] > free


@pytest.mark.parametrize("mode", ["hard", "pad"])
def test_packer_resumes_exactly(tmp_path, mode):
    info = corpus(tmp_path, {"a": 2, "b": 2}, docs_per_file=30, mean_length=50)
    check_stage_resume(lambda: packer(info, 37, mode), 120, (0, 1, 5, 63, 119))


@pytest.mark.parametrize("mode", ["hard", "pad"])
def test_packer_rescales_exactly(tmp_path, mode):
    info = corpus(tmp_path, {"a": 4, "b": 4}, docs_per_file=30, mean_length=50)

    def shard(sid):
        acc = accesses(info)
        streams = [RandomWalk(a, sid, 4, 1, Decoration(bos=1, eos=2)) for a in acc]
        mixer = TokenShareMixer(streams, list(info.ranges), WeightSchedule.constant([2.0, 1.0]))
        return LinePacker(mixer, 37, mode)

    check_stage_rescale(shard, 4, before=2, after=4, batch_size=4)
    check_stage_rescale(shard, 4, before=4, after=1, batch_size=2)


@pytest.mark.parametrize("mode", ["hard", "pad"])
def test_lines_own_their_spans(tmp_path, mode):
    """A line outlives its plan in a shuffle buffer for a few windows: it must not be a
    view that keeps the plan's whole span array alive."""
    lines = packer(corpus(tmp_path), 37, mode)
    for line in [next(lines) for _ in range(3)] + lines.take(20):
        assert line.base is None and line.flags.owndata
