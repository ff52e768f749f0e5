"""Lines held as blocks (``LineBlock``) and the shuffle buffer's store of them
(``LineStore``), each against a plain list-of-arrays model."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import base_config, corpus, small_items, take
from test_packing import packer
from test_shuffle import Counter, numbers

from fmsdata import build_dataloader
from fmsdata.errors import ConfigError
from fmsdata.stages.base import SpanStage, TokenStage
from fmsdata.stages.lineblock import LineBlock
from fmsdata.stages.linestore import RESTORED, LineStore
from fmsdata.stages.packing import LinePacker
from fmsdata.stages.shard import default_stages
from fmsdata.stages.shuffle import ShuffleBuffer
from fmsdata.stages.spans import SPAN_WIDTH
from fmsdata.util.permute import hash_array


def make_lines(sizes, first=0):
    """Lines of ``sizes`` spans whose every value is distinct (the span's number, spread
    over the columns), so a misplaced row or column shows."""
    lines, at = [], first
    for n in sizes:
        values = np.arange(at * SPAN_WIDTH, (at + n) * SPAN_WIDTH, dtype=np.int64)
        lines.append(values.reshape(n, SPAN_WIDTH))
        at += n
    return lines


def pushes_for(store, n, window):
    """Lines ``n`` steps of a store holding ``len(store)`` lines push (two a step while
    below ``window``, then one)."""
    pushes, size = 0, len(store)
    for _ in range(n):
        push = min(2, max(window - size, 0))
        pushes, size = pushes + push, size + push - 1
    return pushes


def same_lines(block, lines):
    got = block.lines()
    assert len(got) == len(lines) == len(block)
    for a, b in zip(got, lines):
        assert np.array_equal(a, b) and a.shape == b.shape


sizes = st.lists(st.integers(0, 9), max_size=30)


@given(
    sizes=sizes,
    picks=st.lists(st.integers(0, 10**6), max_size=40),
    cut=st.tuples(st.integers(0, 40), st.integers(0, 40)),
)
def test_a_block_holds_its_lines(sizes, picks, cut):
    lines = make_lines(sizes)
    block = LineBlock.of(lines)
    same_lines(block, lines)
    assert np.array_equal(block.counts, [len(x) for x in lines])
    if lines:
        which = np.array([p % len(lines) for p in picks], dtype=np.int64)
        same_lines(block.gather(which), [lines[i] for i in which])
        a, b = sorted(c % (len(lines) + 1) for c in cut)
        same_lines(block.slice(a, b), lines[a:b])
    same_lines(LineBlock.concat([block, LineBlock.of(lines[:3]), LineBlock.empty()]),
               lines + lines[:3])  # fmt: skip


def store_model(window, key, steps, sizes):
    """The shuffle buffer one step at a time on a list of lines (``ShuffleBuffer``'s
    docstring): lines handed out, and held at the end."""
    held, out, lines = [], [], iter(make_lines(sizes))
    for step in range(steps):
        for _ in range(min(2, max(window - len(held), 0))):
            held.append(next(lines))
        slot = int(hash_array(key, step, 1)[0] % np.uint64(len(held)))
        out.append(held[slot])
        held[slot] = held[-1]
        held.pop()
    return out, held


@settings(max_examples=60, deadline=None)
@given(
    window=st.integers(2, 40),
    takes=st.lists(st.integers(1, 50), min_size=1, max_size=12),
    seed=st.integers(0, 2**20),
    key=st.integers(0, 2**63),
)
def test_the_store_steps_as_a_list_of_lines_does(window, takes, seed, key):
    """Multi-span lines of random sizes through many steps: the store copies its held
    lines to the front of its array whenever it fills (from 256 rows), and every line still
    comes out whole and in the model's order."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 30, size=2 * sum(takes) + 2).tolist()
    want, held = store_model(window, key, sum(takes), sizes)
    store, source, got, step = LineStore(window), iter(make_lines(sizes)), [], 0
    for n in takes:
        pushed = LineBlock.of([next(source) for _ in range(pushes_for(store, n, window))])
        start, count = store.steps(pushed, hash_array(key, step, n), window)
        got += store.gather(start, count).lines()
        step += n
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    assert [line.tolist() for line in store.lines()] == [line.tolist() for line in held]


@settings(deadline=None)
@given(
    window=st.integers(2, 40),
    takes=st.lists(st.integers(1, 50), min_size=1, max_size=12),
    seed=st.integers(0, 2**20),
)
def test_a_snapshot_stays_as_it_was_while_the_store_goes_on(window, takes, seed):
    """A snapshot taken after any take (a worker's state at a round's end) still reads
    the lines held then after later takes, refills and resizes of the store: the store
    writes only after the rows held and compacts into a new array."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 30, size=2 * sum(takes) + 2).tolist()
    store, source, step, snapshots = LineStore(window), iter(make_lines(sizes)), 0, []
    for n in takes:
        pushed = LineBlock.of([next(source) for _ in range(pushes_for(store, n, window))])
        store.steps(pushed, hash_array(seed, step, n), window)
        step += n
        held = [line.copy() for line in store.lines()]
        snapshots.append((store.snapshot(), held))
    for (rows, start, count), held in snapshots:
        got = [rows[a : a + k] for a, k in zip(start.tolist(), count.tolist())]
        assert [x.tolist() for x in got] == [x.tolist() for x in held]


def test_restored_slots_come_out_by_number():
    """A slot of a loaded state not measured yet holds its line's number in the saved
    form; measured lines around it keep their rows through a refill."""
    store = LineStore(4)
    lines = make_lines([3, 1])
    store.reset([lines[0], 7, lines[1]])
    listed = store.lines()
    assert listed[1] == 7
    assert np.array_equal(listed[0], lines[0]) and np.array_equal(listed[2], lines[1])
    more = LineBlock.of(make_lines([300], first=10))  # forces a refill
    start, count = store.steps(more, np.array([1], dtype=np.uint64), 4)
    assert count.tolist() == [RESTORED] and start.tolist() == [7]
    kept = store.lines()
    assert np.array_equal(kept[0], lines[0]) and np.array_equal(kept[2], lines[1])
    assert np.array_equal(kept[1], more.line(0))


@pytest.mark.parametrize("mode", ["hard", "pad"])
def test_block_takes_give_the_packers_lines(tmp_path, mode):
    info = corpus(tmp_path)
    one, blocks = packer(info, 37, mode), packer(info, 37, mode)
    want = [next(one) for _ in range(60)]
    got = []
    for n in (1, 7, 30, 22):
        got += blocks.take_lines(n).lines()
    assert [x.tolist() for x in got] == [x.tolist() for x in want]
    assert blocks.state_dict() == one.state_dict()


class TakesTwice(LinePacker):
    """Changes ``take`` only: a block take must go through it (and not loop)."""

    def take(self, n):
        return super().take(2 * n)[::2]


def test_a_subclass_take_is_obeyed_by_block_takes(tmp_path):
    info = corpus(tmp_path)
    mine, plain = TakesTwice(*_packer_args(info)), LinePacker(*_packer_args(info))
    got = mine.take_lines(5).lines()
    want = [next(plain) for _ in range(10)][::2]
    assert [x.tolist() for x in got] == [x.tolist() for x in want]


def _packer_args(info):
    p = packer(info, 37)
    return p.source, p.capacity, p.mode


@given(window=st.integers(0, 20), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=8))
def test_shuffle_block_takes_give_what_next_gives(window, sizes):
    reference, blocks = ShuffleBuffer(Counter(), window, 3), ShuffleBuffer(Counter(), window, 3)
    for n in sizes:
        want = numbers(reference, n)
        assert [int(x[0, 2]) for x in blocks.take_lines(n).lines()] == want
    assert blocks.emitted == reference.emitted
    assert [int(x[0, 2]) for x in blocks.buffer] == [int(x[0, 2]) for x in reference.buffer]


def test_a_large_take_leaves_no_large_store_behind():
    """A take far larger than the window (a resume replays lines 4,096 at a time) grows
    the store for that take only: once the window's lines turn over, it is sized to them
    again."""
    window, key = 8, 5
    store, lines, step = LineStore(window), iter(make_lines([60] * 5000)), 0

    def take(n):
        nonlocal step
        block = LineBlock.of([next(lines) for _ in range(pushes_for(store, n, window))])
        store.steps(block, hash_array(key, step, n), window)
        step += n

    take(4)  # fill the window
    for _ in range(3):
        take(1)
    big = LineBlock.of([next(lines) for _ in range(2000)])  # a huge push, as a replay's
    store.steps(big, hash_array(key, step, 2000), window)
    step += 2000
    assert len(store.rows) >= 2000 * 60
    for _ in range(40):
        take(1)
    assert len(store.rows) <= 4 * (window + 2) * 60


class ShortTakes(SpanStage):
    """A user stage whose ``take`` gives one line fewer than asked."""

    def __init__(self, source):
        super().__init__(source)

    def __next__(self):
        return next(self.source)

    def take(self, n):
        return [next(self.source) for _ in range(max(n - 1, 0))]


def test_a_stage_giving_too_few_lines_is_named(tmp_path):
    buffer = ShuffleBuffer(ShortTakes(packer(corpus(tmp_path), 37)), 6, 1)
    with pytest.raises(ConfigError, match=r"ShortTakes.take_lines\(\d+\) gave \d+ lines"):
        buffer.take_lines(3)


KEPT: list = []


class KeepSpans(TokenStage):
    """Keeps every line's spans, as a stage reporting what it saw last might."""

    def apply(self, tokens, content, line):
        KEPT.append((line.spans, line.spans.copy()))
        return content


def keeping(shard):
    return KeepSpans(default_stages(shard))


def test_a_token_stage_may_keep_the_spans_it_was_given(tmp_path, monkeypatch):
    """The item's lines sit in rows the next item reuses: a token stage gets its own."""
    small_items(monkeypatch, per_round=3)
    KEPT.clear()
    take(build_dataloader(base_config(corpus(tmp_path)), stages=keeping), 30)
    assert len(KEPT) > 100
    assert all(np.array_equal(kept, copy) for kept, copy in KEPT)
