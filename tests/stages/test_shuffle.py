import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stagecheck import check_stage_resume

from fmsdata.stages.base import SpanStage
from fmsdata.stages.shuffle import ShuffleBuffer
from fmsdata.stages.spans import SPAN_WIDTH
from fmsdata.util.permute import hash_index


class Counter(SpanStage):
    """Lines numbered 0, 1, 2, ... as one-span lines (the number in the doc field)."""

    def __init__(self):
        self.n = 0

    def children(self):
        return {}

    def __next__(self):
        line = np.zeros((1, SPAN_WIDTH), dtype=np.int64)
        line[0, 2] = self.n
        line[0, 4] = 1
        self.n += 1
        return line

    def own_state(self):
        return {"n": self.n}

    def load_own_state(self, state):
        self.n = state["n"]


def numbers(buffer, n):
    return [int(next(buffer)[0, 2]) for _ in range(n)]


@given(window=st.integers(0, 50), n=st.integers(1, 400), key=st.integers(0, 2**63))
def test_shuffle_is_a_window_local_permutation(window, n, key):
    buffer = ShuffleBuffer(Counter(), window, key)
    out = numbers(buffer, n)
    held = [int(line[0, 2]) for line in buffer.buffer]
    produced = buffer.source.n
    assert sorted(out + held) == list(range(produced))
    assert len(held) <= max(window, 0)
    if window <= 1:
        assert out == list(range(n))


def test_shuffle_mixes(tmp_path):
    window, n = 100, 2000
    out = numbers(ShuffleBuffer(Counter(), window, 5), n)
    assert out != sorted(out)
    # Lines leave within a few windows of arriving: each step takes a given held line
    # with chance 1/window, so a stay is geometric with mean ``window`` and the longest of
    # n stays is about window * ln(n) (~760 here).
    lags = np.abs(np.array(out) - np.arange(n))
    assert lags.max() < 1.5 * window * np.log(n)
    assert 0.5 * window < lags.mean() < 1.5 * window


@given(window=st.integers(2, 30), stop=st.integers(0, 120))
def test_a_buffer_resumes_from_its_state_anywhere(window, stop):
    reference = numbers(ShuffleBuffer(Counter(), window, 9), 150)
    head = ShuffleBuffer(Counter(), window, 9)
    numbers(head, stop)
    state = head.state_dict()
    resumed = ShuffleBuffer(Counter(), window, 9)
    resumed.load_state_dict(state)
    assert [int(x[0, 2]) for x in resumed.buffer] == [int(x[0, 2]) for x in head.buffer]
    assert numbers(resumed, 150 - stop) == reference[stop:]


@settings(max_examples=10, deadline=None)
@given(window=st.integers(0, 30))
def test_shuffle_resumes_exactly(window):
    check_stage_resume(lambda: ShuffleBuffer(Counter(), window, 9), 120, (0, 1, 29, 77, 119))


class PlainLines:
    """A line source written against the bare iterator protocol (no ``SpanStage.take``)."""

    def __init__(self):
        self.inner = Counter()

    def __next__(self):
        return next(self.inner)


class EveryOtherLine(ShuffleBuffer):
    """A subclass that changes what one step hands out: its ``__next__`` must be obeyed
    when lines are taken in bulk too."""

    def __next__(self):
        super().__next__()
        return super().__next__()


@given(window=st.integers(0, 12), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=8))
def test_bulk_takes_give_what_next_gives(window, sizes):
    reference = ShuffleBuffer(Counter(), window, 5)
    bulk = ShuffleBuffer(Counter(), window, 5)
    plain = ShuffleBuffer(PlainLines(), window, 5)
    every = EveryOtherLine(Counter(), window, 5)
    every_reference = EveryOtherLine(Counter(), window, 5)
    for n in sizes:
        want = numbers(reference, n)
        assert [int(line[0, 2]) for line in bulk.take(n)] == want
        assert [int(line[0, 2]) for line in plain.take(n)] == want
        assert [int(x[0, 2]) for x in every.take(n)] == numbers(every_reference, n)
    assert bulk.emitted == reference.emitted


def one_step_at_a_time(window, key, n):
    """The buffer as its docstring describes it, one step at a time: up to two lines in
    while below the window, then the line at slot ``hash_index(key, step, size)`` out, the
    last line taking its place. Returns the numbers handed out and those still held."""
    held, out, produced = [], [], 0
    for step in range(n):
        for _ in range(min(2, max(window - len(held), 0))):
            held.append(produced)
            produced += 1
        slot = hash_index(key, step, len(held))
        out.append(held[slot])
        held[slot] = held[-1]
        held.pop()
    return out, held


@settings(max_examples=60)
@given(
    window=st.integers(2, 40),
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=6),
    key=st.integers(0, 2**64 - 1),
)
def test_the_order_is_the_one_step_at_a_time_model(window, sizes, key):
    buffer = ShuffleBuffer(Counter(), window, key)
    got = [int(line[0, 2]) for n in sizes for line in buffer.take(n)]
    want, held = one_step_at_a_time(window, key, sum(sizes))
    assert got == want
    assert [int(line[0, 2]) for line in buffer.buffer] == held


@settings(deadline=None)
@given(window=st.integers(0, 40), sizes=st.lists(st.integers(1, 60), min_size=1, max_size=10))
def test_a_deferred_state_is_the_state_of_when_it_was_taken(window, sizes):
    """A state taken deferred (a worker's state at each round's end) and made only after
    later takes is the state taken in full at that time, and pickles as it."""
    import pickle

    from fmsdata.stages.deferred import made

    buffer = ShuffleBuffer(Counter(), window, 3)
    taken = []
    for n in sizes:
        buffer.take_lines(n)
        taken.append((buffer.state_dict(deferred=True), buffer.state_dict()))
    for deferred, full in taken:
        travelled = pickle.loads(pickle.dumps(deferred))
        for state in (travelled, made(deferred)):
            assert state.keys() == full.keys()
            assert state["emitted"] == full["emitted"]
            for key, value in full["buffer"].items():
                assert np.array_equal(state["buffer"][key], value), key
                assert state["buffer"][key].dtype == value.dtype, key


class WithExtra(ShuffleBuffer):
    """A user's buffer that saves a field of its own."""

    def own_state(self):
        return {**super().own_state(), "extra": 7}

    def load_own_state(self, state):
        super().load_own_state({k: v for k, v in state.items() if k != "extra"})


@pytest.mark.parametrize("cls", [EveryOtherLine, WithExtra])
def test_a_user_subclass_gives_its_own_plain_state_at_a_round_end(cls):
    """A worker takes states deferred at each round's end: a subclass of the built-in
    buffer (a user's class, whose state is checked as plain data, or one that adds to
    own_state) gives what its own_state gives."""
    buffer = cls(Counter(), 8, 5)
    buffer.take(5)
    deferred, full = buffer.state_dict(deferred=True), buffer.state_dict()
    assert deferred.keys() == full.keys()
    for key, value in full["buffer"].items():
        assert np.array_equal(deferred["buffer"][key], value)
    if cls is WithExtra:
        assert deferred["extra"] == 7
