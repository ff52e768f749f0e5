import numpy as np
import pytest
from chains import check_rotating_passes, take_documents
from hypothesis import given, settings
from hypothesis import strategies as st
from support import accesses, corpus, scratch_dir

from fmsdata.errors import EmptyDatasetError
from fmsdata.stages.documents import Decoration, RandomWalk, shard_files, shard_fragments


def all_docs(info) -> set[tuple[int, int]]:
    return {(f, d) for f, (firsts, _) in enumerate(info.files.values()) for d in range(len(firsts))}


@settings(max_examples=25)
@given(
    n_files=st.integers(1, 6),
    docs=st.integers(1, 30),
    n_shards=st.integers(1, 12),
    seed=st.integers(0, 1000),
)
def test_shards_partition_the_dataset_and_each_epoch_covers_its_shard_once(
    n_files, docs, n_shards, seed
):
    info = corpus(scratch_dir(), {"a": n_files}, docs_per_file=docs, mean_length=5)
    access = accesses(info)[0]
    # Sorted paths equal generation order here (no nesting).
    seen: list[tuple[int, int]] = []
    if n_files * docs < n_shards:  # some shard would hold nothing: the dataset rotates
        for shard in range(n_shards):
            stream = RandomWalk(access, shard, n_shards, seed, Decoration())
            assert stream.size == n_files * docs and stream.rotating
        return
    for shard in range(n_shards):
        stream = RandomWalk(access, shard, n_shards, seed, Decoration())
        size = stream.size
        assert not stream.rotating
        epoch0 = take_documents(stream, size)
        assert len(set(epoch0)) == size, "a document repeats within an epoch"
        lengths = [lens for _, lens in info.files.values()]
        assert stream.state_dict() == {
            "epoch": 1,
            "pos": 0,
            "docs": size,
            "tokens": sum(int(lengths[f][d]) for f, d in epoch0),
            "skipped": 0,
            "size": size,
        }
        epoch1 = take_documents(stream, size)
        assert set(epoch1) == set(epoch0)
        if size >= 8:  # (fewer documents repeat an order by chance: 4 of 2x2 do 1 time in 8)
            assert epoch1 != epoch0, "each epoch should have a fresh order"
        seen.extend(epoch0)
    if len(seen) == n_files * docs:
        assert set(seen) == all_docs(info)
    else:
        assert len(set(seen)) == len(seen)


def test_order_is_a_function_of_seed_and_shard_only(tmp_path):
    info = corpus(tmp_path, {"a": 3}, docs_per_file=40)
    first = take_documents(RandomWalk(accesses(info)[0], 2, 4, 11, Decoration()), 50)
    again = take_documents(RandomWalk(accesses(info)[0], 2, 4, 11, Decoration()), 50)
    other_seed = take_documents(RandomWalk(accesses(info)[0], 2, 4, 12, Decoration()), 50)
    assert first == again
    assert first != other_seed


@given(stop=st.integers(0, 70))
def test_resume_from_any_committed_position(stop):
    info = corpus(scratch_dir(), {"a": 2}, docs_per_file=20)
    stream = RandomWalk(accesses(info)[0], 1, 3, 5, Decoration())
    reference = take_documents(stream, 80)
    head = RandomWalk(accesses(info)[0], 1, 3, 5, Decoration())
    take_documents(head, stop)
    resumed = RandomWalk(accesses(info)[0], 1, 3, 5, Decoration())
    resumed.load_state_dict(head.state_dict())
    assert take_documents(resumed, 80 - stop) == reference[stop:]


def test_short_documents_are_skipped_and_counted(tmp_path):
    info = corpus(tmp_path, {"a": 2}, docs_per_file=50, mean_length=10)
    lengths = np.concatenate([lengths for _, lengths in info.files.values()])
    stream = RandomWalk(accesses(info)[0], 0, 1, 0, Decoration(min_length=10))
    kept = int((lengths >= 10).sum())
    take_documents(stream, kept)
    state = stream.state_dict()
    # The skipped documents after the last kept one are counted when the walk passes them.
    assert state["docs"] == kept
    assert state["skipped"] + kept + (len(lengths) - state["pos"]) % len(lengths) == len(lengths)


def test_shard_fragments_follow_the_fms_layout():
    counts = np.array([10, 3, 7])
    frags = [shard_fragments(counts, 4, s) for s in range(4)]
    covered = {(int(f), d) for fr in frags for f, lo, hi in fr for d in range(lo, hi)}
    assert covered == {(f, d) for f, n in enumerate(counts) for d in range(n)}
    assert sum(len(fr) for fr in frags) <= len(counts) + 4
    # Shard 0 owns the first fragments of file 0 only: it needs no other count.
    assert list(shard_files(3, 4, 0)) == [0]


def test_strip_amounts():
    deco = Decoration(strip=frozenset({7, 8}))
    lead, trail = deco.strip_amounts(
        np.array([3, 1, 0, 2]), np.array([7, 8, -1, 1]), np.array([8, 8, -1, 7])
    )
    assert lead.tolist() == [1, 1, 0, 0]
    assert trail.tolist() == [1, 0, 0, 1]


def test_a_dataset_with_fewer_documents_than_shards_rotates(tmp_path):
    """Two documents, eight shards: each shard reads the whole dataset over a cycle of
    eight epochs (long documents: it is not small by tokens)."""
    info = corpus(tmp_path, {"s": 1}, docs_per_file=2, mean_length=500)
    passes = check_rotating_passes(info, RandomWalk, 8, 0, line_tokens=0)
    assert all(len(docs) == 2 for docs in passes.values())


def test_a_dataset_without_a_kept_document_says_so(tmp_path):
    info = corpus(tmp_path, {"a": 2}, docs_per_file=5, mean_length=3, spread=0.01)
    with pytest.raises(EmptyDatasetError, match=r"every one of the 10 document\(s\) in its 2 "):
        RandomWalk(accesses(info)[0], 0, 2, 0, Decoration(min_length=9)).read_ahead()
