"""The journal arena: workers leave pushed spans in shared memory, items carry their place.

Checked against a model of the blocks (first fit, freed when the received blob goes,
blocks of unreceived blobs freed by ``reclaim``), with every live blob's bytes intact; and
end to end: a full arena (spans back in the items) changes no batch and no state, and
restarted workers find the blocks their predecessors took for items never received.
"""

import functools
import gc
import logging
import os
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import assert_same_batches, base_config, check_resume, corpus, small_items, take

import fmsdata.batchring
import fmsdata.journalarena
from fmsdata import build_dataloader
from fmsdata.errors import ConfigError
from fmsdata.journalarena import BLOCK, ArenaBlob, JournalArena
from fmsdata.narrowrows import NarrowRows


def _blob(nbytes: int, fill: int) -> np.ndarray:
    return np.full(nbytes, fill % 251, dtype=np.uint8)


def test_rows_travel_as_their_place_and_free_their_blocks_when_dropped():
    arena = JournalArena(2, 8 * BLOCK)
    spans = (np.arange(31_457 * 5) % 200).reshape(-1, 5)  # a byte a value: 2.4 blocks
    rows = NarrowRows(spans.copy())
    rows.keep_in(functools.partial(arena.store, 1))
    sent = pickle.dumps(rows)
    assert len(sent) < 1000  # the place, not the bytes
    assert arena.taken_blocks() == 3  # taken by the worker
    received = pickle.loads(sent)
    assert np.array_equal(received.array, spans)  # widened: its blocks are free again
    assert arena.taken_blocks() == 0
    # Dropped before it was read: the blocks go with the last reference.
    again = pickle.loads(pickle.dumps(_kept(arena, 0, spans)))
    assert arena.taken_blocks() == 3
    del again
    assert arena.taken_blocks() == 0


def _kept(arena: JournalArena, worker: int, spans: np.ndarray) -> NarrowRows:
    rows = NarrowRows(spans.copy())
    rows.keep_in(functools.partial(arena.store, worker))
    return rows


def test_rows_that_find_no_room_travel_in_the_pickle():
    arena = JournalArena(1, 2 * BLOCK)
    spans = np.arange(BLOCK * 5, dtype=np.int64).reshape(-1, 5) * 1000  # ~5 blocks packed
    rows = _kept(arena, 0, spans)
    assert arena.taken_blocks() == 0
    sent = pickle.dumps(rows)
    assert len(sent) > 2 * BLOCK
    assert np.array_equal(pickle.loads(sent).array, spans)
    empty = _kept(arena, 0, np.zeros((0, 5), dtype=np.int64))
    assert arena.taken_blocks() == 0 and len(pickle.loads(pickle.dumps(empty)).array) == 0


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(0, 1), st.integers(1, 5 * BLOCK // 2)),
        st.tuples(st.just("receive"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("drop"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("reclaim"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_STEPS)
def test_blocks_follow_a_model_and_live_blobs_stay_intact(steps):
    """Store (first fit in the worker's region, or nothing), receive (unpickled in the
    main process), drop a received blob, reclaim (no workers: every block the main
    process does not hold is free)."""
    blocks = 6
    arena = JournalArena(2, 2 * blocks * BLOCK)
    free = [[True] * blocks for _ in range(2)]
    sent: list[tuple[ArenaBlob, int, int]] = []  # stored, not received: (blob, fill, n)
    held: list[tuple[ArenaBlob, int, int]] = []
    fill = 0
    for op, a, b in steps:
        if op == "store":
            worker, nbytes = a, b
            n = -(-nbytes // BLOCK)
            fits = [s for s in range(blocks - n + 1) if all(free[worker][s : s + n])]
            fill += 1
            blob = arena.store(worker, _blob(nbytes, fill))
            if not fits:
                assert blob is None
                continue
            assert blob is not None and (blob.worker, blob.first) == (worker, fits[0])
            free[worker][fits[0] : fits[0] + n] = [False] * n
            sent.append((blob, fill, nbytes))
        elif op == "receive" and sent:
            blob, f, nbytes = sent.pop(a % len(sent))
            held.append((pickle.loads(pickle.dumps(blob)), f, nbytes))
        elif op == "drop" and held:
            blob, _, _ = held.pop(a % len(held))
            free[blob.worker][blob.first : blob.first + blob.blocks] = [True] * blob.blocks
            del blob
        elif op == "reclaim":
            arena.reclaim()
            for blob, _, _ in sent:
                free[blob.worker][blob.first : blob.first + blob.blocks] = [True] * blob.blocks
            sent.clear()
        used = arena.used.numpy()
        assert [[not f for f in row] for row in free] == (used == 1).tolist()
        for blob, f, nbytes in held + sent:
            assert np.array_equal(blob.array, _blob(nbytes, f)), "a live blob was written over"


def test_too_little_shared_memory_for_the_arena_is_a_config_error(monkeypatch):
    monkeypatch.setattr(fmsdata.batchring, "shared_memory_free", lambda: 1000)
    with pytest.raises(ConfigError, match=r"journal arena needs 64 MiB of shared memory"):
        JournalArena(4)


@pytest.mark.parametrize("blocks", [1, 3])
def test_an_arena_too_small_for_every_journal_changes_no_batch_and_no_state(
    tmp_path, monkeypatch, blocks
):
    """One or three blocks a worker: some rounds' spans find room, the others travel in
    their items; resumed anywhere, the batches are the uninterrupted run's."""
    small_items(monkeypatch, per_round=2)
    monkeypatch.setattr(fmsdata.journalarena, "ARENA_BYTES", 2 * blocks * BLOCK)
    info = corpus(tmp_path, mean_length=6)
    config = base_config(info, num_workers=2, shuffle_window=5)
    reference = take(build_dataloader(base_config(info, shuffle_window=5)), 60)
    assert len(reference) == 60
    assert_same_batches(reference, take(build_dataloader(config), 60))
    check_resume(lambda: build_dataloader(config), total=60, points=[7, 33])


def test_restarted_workers_find_the_blocks_of_items_never_received(tmp_path, monkeypatch):
    """Each iteration stops with items in flight whose spans are in the arena, at most
    ``prefetch_factor`` + 1 of each worker (one a block here); those blocks are free
    again when the next workers start, so the blocks taken and not held never add up."""
    small_items(monkeypatch, per_round=1)
    monkeypatch.setattr(fmsdata.journalarena, "ARENA_BYTES", 2 * 64 * BLOCK)
    info = corpus(tmp_path, mean_length=6)
    loader = build_dataloader(base_config(info, num_workers=2, shuffle_window=3))
    in_flight = 2 * (loader.config.prefetch_factor + 1)
    unreceived, arenas = [], set()
    for _ in range(8):
        iteration = iter(loader)
        take(iteration, 5)
        iteration.close()  # the workers stop; the items they made ahead are never received
        arena = loader._journal
        arenas.add(id(arena))
        unreceived.append(int(np.count_nonzero((arena.used.numpy() == 1) & ~arena._held)))
    assert 0 < max(unreceived) <= in_flight, unreceived
    assert len(arenas) == 1  # one arena, reused (and reclaimed) by every iteration


def _received_blob(arena, worker, nbytes, fill):
    blob = arena.store(worker, _blob(nbytes, fill))
    return pickle.loads(pickle.dumps(blob))


def test_a_forked_worker_dropping_what_it_inherited_frees_nothing():
    """A worker forked while the main process holds received blobs inherits them; where
    its garbage collector frees them, the main process's blocks stay taken and intact."""
    arena = JournalArena(1, 4 * BLOCK)
    inherited = [_received_blob(arena, 0, BLOCK + 1, 9)]
    pid = os.fork()
    if pid == 0:  # the child: drop the inherited blob, as a worker's collector may
        try:
            inherited.clear()
            gc.collect()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert arena.taken_blocks() == 2
    assert np.array_equal(inherited[0].array, _blob(BLOCK + 1, 9))


def test_a_received_blob_copied_carries_its_bytes_and_frees_nothing():
    """Pickled again in the main process (a deep copy of an item), a received blob travels
    as its bytes: two owners of the same blocks would free them twice."""
    arena = JournalArena(1, 4 * BLOCK)
    stored = arena.store(0, _blob(100, 5))
    sent = pickle.dumps(stored)
    received = pickle.loads(sent)
    copied = pickle.loads(pickle.dumps(received))
    assert isinstance(copied, np.ndarray) and np.array_equal(copied, _blob(100, 5))
    del copied
    assert arena.taken_blocks() == 1
    with pytest.raises(RuntimeError, match="twice"):
        pickle.loads(sent)  # the same place received again
    del received
    assert arena.taken_blocks() == 0


def test_without_shared_memory_for_the_arena_the_spans_travel_in_the_items(
    tmp_path, monkeypatch, caplog
):
    """The arena is a saving, not a need: where /dev/shm holds the ring but not the arena,
    a warning says so once and the batches are the same."""
    info = corpus(tmp_path, mean_length=6)
    reference = take(build_dataloader(base_config(info)), 20)
    monkeypatch.setattr(fmsdata.batchring, "shared_memory_free", lambda: 2 << 20)
    loader = build_dataloader(base_config(info, num_workers=2))
    with caplog.at_level(logging.WARNING, logger="fmsdata.loader"):
        assert_same_batches(reference[:10], take(loader, 10))
        assert_same_batches(reference[10:], take(loader, 10))  # a second iteration
    warnings = [r for r in caplog.records if "journal arena needs" in r.getMessage()]
    assert len(warnings) == 1 and loader._journal is None
