"""Rounds: a worker pulls each logical shard's lines for several items at once and takes
its state once, after the round's last item (``fmsdata.transport.rounds.item_rounds``).

The items inside a round carry no shard state: a state saved there is the shards' state
at the previous round's end plus the lines consumed since, replayed on resume. These
tests make items of two batches, so rounds come within a few batches, and check that
rounds change no batch and that a resume at any batch, inside a round or at its edge,
continues token for token, with stateful stages at span and token level, with skips, on
another worker count and on another number of ranks.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import (
    EOS,
    assert_same_batches,
    base_config,
    corpus,
    global_steps,
    rank_loaders,
    roundtrip,
    scratch_dir,
    small_items,
    take,
)
from test_user_stages import everywhere

import fmsdata.transport.rounds
from fmsdata import build_dataloader
from fmsdata.loader.consumed import ConsumedState

TOTAL = 40


def config(info, **overrides):
    return base_config(
        info,
        strip_tokens=[EOS],
        return_position_ids=True,
        return_cu_seqlens=True,
        return_document_ids=True,
        **overrides,
    )


@pytest.fixture(scope="module")
def data():
    """One corpus and its uninterrupted batches, made without rounds (items of 64 batches:
    none is complete before batch 127), with a stateful stage at span and token level."""
    info = corpus(scratch_dir())
    return info, take(build_dataloader(config(info), stages=everywhere), TOTAL + 30)


def test_items_come_in_rounds(monkeypatch):
    """The sizes the workers follow: growing items and the first full one a round each
    (the first batch waits for one item), then full rounds."""
    small_items(monkeypatch, per_round=3)
    counts = fmsdata.transport.rounds.item_batch_counts(4, 33, 1)
    rounds = fmsdata.transport.rounds.item_rounds(counts)
    assert [next(rounds) for _ in range(4)] == [[1], [2], [2, 2, 2], [2, 2, 2]]
    one = fmsdata.transport.rounds.item_rounds([1])  # items of one batch from the start
    assert [next(one) for _ in range(2)] == [[1], [1, 1, 1]]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("items_per_round", [1, 3])
def test_rounds_change_no_batch(data, monkeypatch, num_workers, items_per_round):
    info, reference = data
    small_items(monkeypatch, per_round=items_per_round)
    loader = build_dataloader(config(info, num_workers=num_workers), stages=everywhere)
    assert_same_batches(reference[:TOTAL], take(loader, TOTAL))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    workers=st.sampled_from([0, 1, 2]),
    resumed_workers=st.sampled_from([0, 1, 3]),
    items_per_round=st.sampled_from([2, 3, 5]),
    at=st.integers(0, TOTAL - 1),
    skip=st.integers(0, 5),
)
def test_a_resume_anywhere_in_a_round_is_exact(
    data, monkeypatch, workers, resumed_workers, items_per_round, at, skip
):
    info, reference = data
    small_items(monkeypatch, per_round=items_per_round)
    head = build_dataloader(config(info, num_workers=workers), stages=everywhere)
    got = take(head, at // 2)
    head.skip(skip)  # consumed lines without their batches, from inside a round
    got += take(head, at - at // 2)
    state = roundtrip(head.snapshot())
    resumed = build_dataloader(config(info, num_workers=resumed_workers), stages=everywhere)
    resumed.load_state_dict(state)
    got += take(resumed, TOTAL - at)
    expected = reference[: at // 2] + reference[at // 2 + skip : TOTAL + skip]
    assert_same_batches(expected, got)


def test_a_state_saved_inside_a_round_rescales_exactly(data, monkeypatch):
    """G3 from inside a round: two ranks (one worker each, items of two batches, rounds of
    three) save after 11 global steps, the middle of a round; one and four ranks continue
    with the global steps of an uninterrupted run on two ranks without rounds."""
    info, _ = data
    wide = config(info, logical_shards=8)
    reference = global_steps(rank_loaders(wide, 2, batch_size=4), 24)
    small_items(monkeypatch, per_round=3)
    before = rank_loaders(wide, 2, batch_size=4, num_workers=1)
    assert global_steps(before, 11) == reference[:11]
    states = [roundtrip(loader.snapshot()) for loader in before]
    for world in (1, 4):
        after = rank_loaders(wide, world, batch_size=8 // world)
        for loader in after:
            loader.load_state_dict(states)
        assert global_steps(after, 13) == reference[11:]


def test_the_check_catches_a_replica_that_counts_only_the_last_item(data, monkeypatch):
    """The resume test above fails where the main process takes a round's state as past
    only its last item's lines (what it did before rounds): the lines of the round's other
    items would be replayed twice."""
    info, reference = data
    small_items(monkeypatch, per_round=3)
    real = ConsumedState.finish_item

    def last_item_only(self, item):
        item.state_lines = item.state_lines * 0 + [
            int((item.row_shards == sid).sum()) for sid in item.states.shards
        ]
        real(self, item)

    monkeypatch.setattr(ConsumedState, "finish_item", last_item_only)
    head = build_dataloader(config(info), stages=everywhere)
    take(head, 11)  # past the first full round's end (batch 9)
    resumed = build_dataloader(config(info), stages=everywhere)
    resumed.load_state_dict(roundtrip(head.snapshot()))
    with pytest.raises(AssertionError, match="differs"):
        assert_same_batches(reference[11:20], take(resumed, 9))


def test_a_round_holds_as_many_items_as_its_spans_allow(monkeypatch):
    """A round's items fill ``_ROUND_SPANS`` spans, between the least and the most items
    a round may hold; a round is sized by the spans per batch seen last."""
    monkeypatch.setattr(fmsdata.transport.rounds, "_ROUND_SPANS", 100)
    monkeypatch.setattr(fmsdata.transport.rounds, "_MIN_ITEMS_PER_ROUND", 2)
    monkeypatch.setattr(fmsdata.transport.rounds, "_ITEMS_PER_ROUND", 6)
    per_round = fmsdata.transport.rounds.items_per_round
    assert [per_round(s) for s in (0, 10, 16.7, 20, 34, 51, 1000)] == [6, 6, 5, 5, 2, 2, 2]
    # Spans per batch as each full round starts (the growing items are a round each).
    seen = iter([0.0, 12.5, 30.0, 2.0])
    rounds = fmsdata.transport.rounds.item_rounds([1, 2], lambda: next(seen))
    assert [next(rounds) for _ in range(6)] == [[1], [2], [2] * 6, [2] * 4, [2] * 2, [2] * 6]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_rounds_of_changing_size_change_no_batch_and_resume_exactly(data, monkeypatch, num_workers):
    """Rounds sized anew each time (here by a cycle of sizes, not by spans) give the
    batches of a run without rounds, and a resume inside any of them is exact."""
    info, reference = data
    small_items(monkeypatch)
    sizes, asked = iter([3, 1, 5, 2] * 20), []

    def next_size(spans_per_item):
        asked.append(spans_per_item)
        return next(sizes)

    monkeypatch.setattr(fmsdata.transport.rounds, "items_per_round", next_size)
    head = build_dataloader(config(info, num_workers=num_workers), stages=everywhere)
    got = take(head, 17)
    resumed = build_dataloader(config(info, num_workers=num_workers), stages=everywhere)
    resumed.load_state_dict(roundtrip(head.snapshot()))
    got += take(resumed, TOTAL - 17)
    assert_same_batches(reference[:TOTAL], got)
    if num_workers == 0:  # the rounds were sized by the spans the worker pulled
        assert asked and all(spans > 0 for spans in asked)
