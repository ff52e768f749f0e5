"""The best-fit packer stage: its lines are the one-at-a-time model's over the source's
documents, it resumes and rescales exactly, its state holds what it took and has not handed
out, and it counts what it reports."""

import itertools

import numpy as np
import pytest
from bestfitmodel import best_fit_windows
from hypothesis import given, settings
from hypothesis import strategies as st
from stagecheck import check_stage_rescale, check_stage_resume, line_key, saved
from support import accesses, corpus, scratch_dir

from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.stages.base import DatasetRenumbering
from fmsdata.stages.bestfit import COUNTS, BestFitPacker
from fmsdata.stages.documents import Decoration, RandomWalk
from fmsdata.stages.mixing import TokenShareMixer
from fmsdata.stages.savedlines import pack_lines, unpack_lines
from fmsdata.stages.schedule import WeightSchedule
from fmsdata.stages.spans import DOC, DS, FILE, LENGTH, START


def mixer(info, shard=0, n_shards=1, seed=1, weights=None):
    acc = accesses(info)
    streams = [RandomWalk(a, shard, n_shards, seed, Decoration(bos=1, eos=2)) for a in acc]
    weights = weights or [2.0, 1.0][: len(acc)] + [1.0] * max(0, len(acc) - 2)
    return TokenShareMixer(streams, list(info.ranges), WeightSchedule.constant(weights))


def packer(info, capacity, window, **kwargs):
    return BestFitPacker(mixer(info, **kwargs), capacity, window)


def source_order(info, **kwargs):
    """The documents the source gives, ``((ds, file, doc), dlen)``, read without a packer."""
    source = mixer(info, **kwargs)
    while True:
        block = source.read_ahead()
        for ds, f, d, dlen in zip(block.ds, block.file, block.doc, block.dlen):
            yield (int(ds), int(f), int(d)), int(dlen)


def source_documents(info, n, **kwargs):
    """The first ``n`` documents the source gives."""
    return list(itertools.islice(source_order(info, **kwargs), n))


def as_pieces(line):
    return [((int(s[DS]), int(s[FILE]), int(s[DOC])), int(s[START]), int(s[LENGTH])) for s in line]


@settings(max_examples=25, deadline=None)
@given(
    capacity=st.integers(4, 200),
    window=st.integers(1, 40),
    mean=st.integers(1, 150),
    seed=st.integers(0, 100),
)
def test_lines_are_the_models_over_the_sources_documents(capacity, window, mean, seed):
    info = corpus(scratch_dir(), {"a": 2, "b": 1}, docs_per_file=20, mean_length=mean)
    p = packer(info, capacity, window, seed=seed)
    got = [as_pieces(next(p)) for _ in range(60)]
    docs = source_order(info, seed=seed)
    want: list = []
    open_lines: list = []
    while len(want) < 60:  # the model a window at a time
        chunk = list(itertools.islice(docs, window))
        (out,) = best_fit_windows(chunk, window, capacity, open_lines)
        want += out["lines"]
        open_lines = out["open"]
    assert got == want[:60]


def test_resumes_exactly_at_any_line(tmp_path):
    info = corpus(tmp_path, {"a": 2, "b": 2}, docs_per_file=30, mean_length=50)
    # Windows of 7 documents make about 3 lines each: the points fall at a window's
    # start, inside one and at its last line; 120 lines cross an epoch of each dataset.
    check_stage_resume(lambda: packer(info, 37, 7), 120, range(0, 120, 7))
    check_stage_resume(lambda: packer(info, 37, 7), 40, [1, 2, 3, 4, 5, 6])


@pytest.mark.parametrize("window", [1, 5, 64])
def test_rescales_exactly(tmp_path, window):
    info = corpus(tmp_path, {"a": 4, "b": 4}, docs_per_file=30, mean_length=50)

    def shard(sid):
        return packer(info, 37, window, shard=sid, n_shards=4)

    check_stage_rescale(shard, 4, before=2, after=4, batch_size=4)
    check_stage_rescale(shard, 4, before=4, after=1, batch_size=2)


def test_the_state_holds_what_was_taken_and_not_handed_out(tmp_path):
    """Every document the source committed is in the lines handed out or in the state's
    ready and open lines, each token exactly once, and nothing else is."""
    info = corpus(tmp_path, {"a": 2, "b": 1}, docs_per_file=60, mean_length=40)
    order = source_documents(info, 150)
    for n in (0, 1, 9, 10, 31, 77):
        p = packer(info, 50, 11)
        handed = [as_pieces(next(p)) for _ in range(n)]
        state = saved(p)
        streams = state["source"]["sources"]
        assert all(streams[name]["epoch"] == 0 for name in ("a", "b"))
        taken = order[: sum(streams[name]["pos"] for name in ("a", "b"))]
        assert len(taken) % 11 == 0  # whole windows
        held = [
            ((int(r[0]), int(r[1]), int(r[2])), int(r[3]), int(r[4]))
            for r in BestFitPacker.held_spans(state)
        ]
        pieces: dict[tuple, list[tuple[int, int]]] = {}
        for name, start, length in [piece for line in handed for piece in line] + held:
            pieces.setdefault(name, []).append((start, length))
        assert sorted(pieces) == sorted(name for name, _ in taken)
        for name, dlen in taken:
            spans = sorted(pieces[name])
            ends = [start + length for start, length in spans]
            assert [start for start, _ in spans] == [0, *ends[:-1]] and ends[-1] == dlen


def test_counts_are_the_closed_lines_figures(tmp_path):
    """``counts`` covers the lines handed out and the ready ones: their number, padding,
    pieces, and the documents longer than a line (cut into line-sized pieces)."""
    info = corpus(tmp_path, {"a": 2, "b": 1}, docs_per_file=25, mean_length=60, spread=1.5)
    capacity = 40
    p = packer(info, capacity, 9)
    handed = [as_pieces(next(p)) for _ in range(53)]
    state = saved(p)
    ready = unpack_lines(state["ready"])
    closed = handed + [
        [((int(r[0]), int(r[1]), int(r[2])), int(r[3]), int(r[4])) for r in ready.line(i)]
        for i in range(len(ready))
    ]
    lengths = dict(source_documents(info, 200))
    counts = state["counts"]
    assert set(counts) == set(COUNTS)
    assert counts["lines"] == len(closed)
    assert counts["line_tokens"] == len(closed) * capacity
    padding = sum(capacity - sum(length for _, _, length in line) for line in closed)
    assert counts["padding_tokens"] == padding
    assert counts["document_pieces"] == sum(len(line) for line in closed)
    cut = {
        name
        for line in closed
        for name, start, _ in line
        if start == 0 and lengths[name] > capacity
    }
    assert counts["cut_documents"] == len(cut) > 0
    report = BestFitPacker.report(state)
    assert report["held_as"] == "unsent" and report["counts"] == counts


def test_lines_own_their_spans(tmp_path):
    lines = packer(corpus(tmp_path), 37, 8)
    for line in [next(lines) for _ in range(3)] + lines.take(20):
        assert line.base is None and line.flags.owndata


def test_take_and_take_lines_are_next_repeated(tmp_path):
    info = corpus(tmp_path, mean_length=30)
    one = packer(info, 41, 6)
    want = [line_key(next(one)) for _ in range(50)]
    many = packer(info, 41, 6)
    got = [line_key(line) for line in many.take(7)]
    block = many.take_lines(43)
    got += [line_key(block.line(i)) for i in range(len(block))]
    assert got == want


def test_a_mix_change_renumbers_the_held_lines(tmp_path):
    info = corpus(tmp_path, {"a": 2, "b": 1}, docs_per_file=25, mean_length=40)
    p = packer(info, 50, 11)
    [next(p) for _ in range(5)]
    state = saved(p)
    own = {key: state[key] for key in ("ready", "open", "counts")}
    change = DatasetRenumbering(("c", "b", "a"), np.array([2, 1]), rebase=False)
    moved, _ = BestFitPacker.carry_over(own, {}, change)
    before = BestFitPacker.held_spans(own)
    after = BestFitPacker.held_spans(moved)
    assert (after[:, DS] == np.array([2, 1])[before[:, DS]]).all()
    assert (after[:, 1:] == before[:, 1:]).all() and moved["counts"] == own["counts"]


def test_a_loaded_state_is_checked(tmp_path):
    info = corpus(tmp_path, mean_length=40)
    p = packer(info, 50, 11)
    [next(p) for _ in range(4)]
    state = saved(p)

    def load(changed):
        packer(info, 50, 11).load_state_dict(changed)

    def lines_of(*lengths):
        return pack_lines([np.array([[0, 0, i, 0, n, -1, -1]]) for i, n in enumerate(lengths)])

    load({**state, "ready": lines_of(50, 3), "open": lines_of(49)})  # fits
    with pytest.raises(StateMismatchError, match="open: line 1 holds 50 document tokens"):
        load({**state, "open": lines_of(3, 50)})  # an open line has room left
    with pytest.raises(StateMismatchError, match="ready: line 0 holds 51 document tokens"):
        load({**state, "ready": lines_of(51)})
    with pytest.raises(StateMismatchError, match="counts"):
        load({**state, "counts": {"lines": 3}})
    with pytest.raises(StateMismatchError, match="counts.lines"):
        load({**state, "counts": {**state["counts"], "lines": -1}})


def test_bad_settings_are_refused(tmp_path):
    source = mixer(corpus(tmp_path))
    with pytest.raises(ConfigError, match="pack_window"):
        BestFitPacker(source, 10, 0)
    with pytest.raises(ConfigError, match="at least one document token"):
        BestFitPacker(source, 0, 4)
