"""G2 world-size invariance and G3 exact rescale."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import (
    Ledger,
    base_config,
    check_exactly_once_per_epoch,
    corpus,
    global_steps,
    rank_loaders,
    roundtrip,
    scratch_dir,
    take,
)

from fmsdata import build_dataloader


def test_a_global_step_holds_the_same_sequences_for_any_world_size(tmp_path):
    info = corpus(tmp_path)
    config = base_config(info, logical_shards=8)
    one = global_steps(rank_loaders(config, 1, batch_size=8, num_workers=0), 12)
    two = global_steps(rank_loaders(config, 2, batch_size=4, num_workers=2), 12)
    four = global_steps(rank_loaders(config, 4, batch_size=2, num_workers=1), 12)
    assert one == two == four


@settings(max_examples=12)
@given(
    shards_per_rank=st.sampled_from([1, 2, 3]),
    world=st.sampled_from([1, 2, 4]),
    lines_per_shard=st.integers(1, 3),
    seed=st.integers(0, 1000),
    window=st.integers(0, 8),
)
def test_world_size_invariance_over_configurations(
    shards_per_rank, world, lines_per_shard, seed, window
):
    info = corpus(scratch_dir(), {"a": 2, "b": 2}, docs_per_file=30)
    n_shards = 4 * shards_per_rank
    global_batch = n_shards * lines_per_shard
    config = base_config(info, logical_shards=n_shards, seed=seed, shuffle_window=window)
    reference = global_steps(rank_loaders(config, 1, batch_size=global_batch), 6)
    assert (
        global_steps(rank_loaders(config, world, batch_size=global_batch // world), 6) == reference
    )


@pytest.mark.parametrize("new_world", [2, 8])
def test_rescale_continues_with_the_same_global_steps(tmp_path, new_world):
    info = corpus(tmp_path)
    config = base_config(info, logical_shards=8)
    reference = global_steps(rank_loaders(config, 4, batch_size=2), 20)
    before = rank_loaders(config, 4, batch_size=2)
    head = global_steps(before, 7)
    assert head == reference[:7]
    states = [roundtrip(loader.snapshot()) for loader in before]
    after = rank_loaders(config, new_world, batch_size=8 // new_world)
    for loader in after:
        loader.load_state_dict(states)
    assert global_steps(after, 13) == reference[7:]


def test_rescale_to_a_world_size_that_does_not_divide_the_shards(tmp_path):
    info = corpus(tmp_path, {"a": 2, "b": 3}, docs_per_file=20, mean_length=30)
    config = base_config(info, logical_shards=8)
    ledger = Ledger(info, config)
    before = rank_loaders(config, 4, batch_size=2)
    for loader in before:
        ledger.add_batches(take(loader, 5))
    states = [roundtrip(loader.snapshot()) for loader in before]
    after = rank_loaders(config, 3, batch_size=3)
    for loader in after:
        loader.load_state_dict(states)
    for loader in after:
        ledger.add_batches(take(loader, 9))
    settled = [loader.snapshot(settle=True) for loader in after]
    for state in settled:
        ledger.add_state(state)
    check_exactly_once_per_epoch(ledger, settled, 8)


def test_a_rank_state_alone_cannot_rescale(tmp_path):
    from fmsdata.errors import StateMismatchError

    info = corpus(tmp_path)
    config = base_config(info, logical_shards=4)
    loader = build_dataloader(config, rank=0, world_size=2)
    take(loader, 2)
    other = build_dataloader(config, rank=0, world_size=4)
    other.load_state_dict(loader.state_dict())  # shards 0 of 4 is inside rank 0 of 2: fine
    wider = build_dataloader(config, rank=0, world_size=1)
    with pytest.raises(StateMismatchError, match="logical shard"):
        wider.load_state_dict(loader.state_dict())


@given(
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=9),
    batch=st.integers(1, 12),
    rounds=st.integers(1, 6),
)
def test_row_dealer_follows_the_fewest_emitted_rule(counts, batch, rounds):
    from fmsdata.worker.topology import RowDealer

    dealer = RowDealer(list(counts))
    expected = list(counts)
    for _ in range(rounds):
        rows = dealer.deal(batch)
        for row in rows:
            want = min(range(len(expected)), key=lambda i: (expected[i], i))
            assert row == want
            expected[want] += 1


@given(
    n_local=st.integers(1, 40),
    workers=st.integers(1, 8),
    batch=st.integers(1, 12),
    rounds=st.integers(1, 20),
)
def test_workers_split_the_shards_evenly_and_level_batches_whole_when_runs_divide(
    n_local, workers, batch, rounds
):
    from fmsdata.worker.topology import RowDealer, worker_shards

    split = [worker_shards(n_local, w, workers, batch) for w in range(workers)]
    assert sorted(s for part in split for s in part) == list(range(n_local))
    assert max(map(len, split)) - min(map(len, split)) <= 1
    owner = {s: w for w, part in enumerate(split) for s in part}
    whole = n_local % batch == 0 and (n_local // batch) % workers == 0
    dealer = RowDealer([0] * n_local)
    for _ in range(rounds):
        makers = {owner[s] for s in dealer.deal(batch)}
        if whole:
            assert len(makers) == 1  # the main process copies the batch in one piece
