"""A document order of the user's own: one ``DocumentStream`` subclass (``walk_order``).

Checked against independent references: the corpus writer's documents (each epoch of a
shard reads its fragments' documents exactly once, in the order the subclass promises)
and the uninterrupted run (resume and rescale through the stage checker). A hook that
does not return a permutation is refused, naming the class and the dataset.
"""

import numpy as np
import pytest
from chains import recipe
from hypothesis import given, settings
from hypothesis import strategies as st
from stagecheck import check_stage_rescale, check_stage_resume
from support import accesses, corpus, scratch_dir

from fmsdata.errors import ConfigError
from fmsdata.permute import derive_key, permute
from fmsdata.pipeline import build_pipeline
from fmsdata.stages import Decoration, DocumentStream, WalkOrder, walk
from fmsdata.stages.documents import shard_fragments


class FilesShuffled(DocumentStream):
    """Fragments in a keyed order per cycle, documents in stored order inside each."""

    def walk_order(self, fragments, cycle):
        n = len(fragments)
        key = derive_key(self.seed, self.access.name, self.shard, "files", cycle)
        return WalkOrder(permute(np.arange(n), n, key))


class Backwards(DocumentStream):
    """Fragments last to first, each fragment's documents keyed by (shard, cycle, file)."""

    def walk_order(self, fragments, cycle):
        n = len(fragments)
        keys = [derive_key(self.seed, self.shard, cycle, int(f)) for f in fragments[::-1, 0]]
        return WalkOrder(np.arange(n)[::-1], keys)


class NotAPermutation(DocumentStream):
    def walk_order(self, fragments, cycle):
        return WalkOrder(np.zeros(len(fragments), dtype=np.int64))


def read(stream, n, bite=3):
    """``(file, doc)`` of ``n`` documents, committed in bites as a packer does."""
    out = []
    while len(out) < n:
        block = stream.read_ahead()
        take = min(len(block), n - len(out), bite)
        out.extend(zip(block.file[:take].tolist(), block.doc[:take].tolist()))
        stream.commit(take)
        stream.rewind()
    return out


@settings(max_examples=20, deadline=None)
@given(
    order=st.sampled_from([FilesShuffled, Backwards]),
    n_files=st.integers(1, 4),
    docs=st.integers(1, 9),
    n_shards=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 50),
    cut=st.integers(0, 30),
)
def test_each_epoch_reads_the_shards_documents_once_in_the_promised_order(
    order, n_files, docs, n_shards, seed, cut
):
    info = corpus(scratch_dir(), {"a": n_files}, docs_per_file=docs, mean_length=4)
    access = accesses(info)[0]
    counts = np.array([len(f) for f, _ in info.files.values()])
    for shard in range(n_shards):
        rows = shard_fragments(counts, n_shards, shard)
        mine = {(f, d) for f, lo, hi in rows.tolist() for d in range(lo, hi)}
        if not mine:
            continue
        stream = order(access, shard, n_shards, seed, Decoration())
        size = len(mine)
        epochs = [read(stream, size), read(stream, size)]
        for got in epochs:
            assert sorted(got) == sorted(mine), "an epoch is not its shard's documents once"
            if order is FilesShuffled:  # stored order inside every fragment
                for f, lo, hi in rows.tolist():
                    assert [d for g, d in got if g == f and lo <= d < hi] == list(range(lo, hi))
            else:  # fragments last to first
                firsts = [
                    next(i for i, (g, d) in enumerate(got) if (g, d) in frag)
                    for frag in ({(f, d) for d in range(lo, hi)} for f, lo, hi in rows.tolist())
                ]
                assert firsts == sorted(firsts, reverse=True)
        # A resume anywhere continues exactly: the state is the stream's, not the order's.
        again = order(access, shard, n_shards, seed, Decoration())
        k = cut % (2 * size)
        read(again, k)
        resumed = order(access, shard, n_shards, seed, Decoration())
        resumed.load_state_dict(again.state_dict())
        assert read(resumed, 2 * size - k) == (epochs[0] + epochs[1])[k:]


def custom_chain(info, rec, order):
    """Logical shard ``sid``'s default chain with ``order`` as every dataset's stream."""

    def build(sid):
        factory = lambda shard: shard.shuffle(shard.pack(shard.documents(order)))  # noqa: E731
        return build_pipeline(sid, rec, accesses(info, list(rec.names)), factory).top

    return build


@settings(max_examples=6, deadline=None)
@given(
    order=st.sampled_from([FilesShuffled, Backwards]),
    before=st.sampled_from([1, 2, 4]),
    after=st.sampled_from([1, 2, 4]),
    points=st.lists(st.integers(0, 50), min_size=1, max_size=3),
    seed=st.integers(0, 99),
)
def test_a_chain_with_a_custom_order_resumes_and_rescales(order, before, after, points, seed):
    info = corpus(scratch_dir(), {"a": 3, "b": 2}, docs_per_file=10)
    rec = recipe(
        info, datasets=["a", "b"], weights=[2, 1], seq_length=20, logical_shards=4, seed=seed
    )
    build = custom_chain(info, rec, order)
    top = build(1)
    streams = [stage for _, stage in walk(top) if stage.role == "dataset"]
    assert [type(s) for s in streams] == [order, order], "walk finds each dataset's stream"
    check_stage_resume(lambda: build(1), 50, points)
    check_stage_rescale(build, 4, before, after, 4)


def test_an_order_that_is_not_a_permutation_is_refused():
    info = corpus(scratch_dir(), {"a": 2}, docs_per_file=5)
    stream = NotAPermutation(accesses(info)[0], 0, 1, 0, Decoration())
    with pytest.raises(ConfigError, match="NotAPermutation.walk_order.*permutation.*'a'"):
        stream.read_ahead()
