import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from stagecheck import check_stage_rescale, check_stage_resume, saved
from support import accesses, corpus, scratch_dir

from fmsdata.stages.documents import Decoration, RandomWalk
from fmsdata.stages.mixing import TokenShareMixer, _range_totals
from fmsdata.stages.packing import LinePacker
from fmsdata.stages.schedule import WeightSchedule


def mixer(info, weights, shard=0, n_shards=1, seed=3, deco=None):
    deco = deco or Decoration()
    names = list(info.ranges)
    acc = accesses(info)
    streams = [RandomWalk(a, shard, n_shards, seed, deco) for a in acc]
    return TokenShareMixer(streams, names, WeightSchedule.constant(weights))


def mix(m: TokenShareMixer, n: int) -> list[tuple[int, int, int, int]]:
    """Take ``n`` mixed documents, committing in uneven bites; (ds, file, doc, dlen) each."""
    out = []
    bite = 2
    while len(out) < n:
        docs = m.read_ahead()
        take = min(len(docs), n - len(out), bite)
        out.extend(
            zip(
                docs.ds[:take].tolist(),
                docs.file[:take].tolist(),
                docs.doc[:take].tolist(),
                docs.dlen[:take].tolist(),
            )
        )
        m.commit(take)
        m.rewind()
        bite = bite * 5 % 13 + 1
    return out


def greedy_reference(streams_docs, weights, n):
    """The rule spelled out one document at a time."""
    taken = [0] * len(weights)
    pos = [0] * len(weights)
    out = []
    for _ in range(n):
        d = min(range(len(weights)), key=lambda i: (taken[i] / weights[i], i))
        doc = streams_docs[d][pos[d]]
        pos[d] += 1
        taken[d] += doc[3]
        out.append(doc)
    return out


@settings(max_examples=20)
@given(
    weights=st.lists(st.floats(0.05, 20), min_size=2, max_size=3),
    seed=st.integers(0, 100),
)
def test_block_merge_equals_the_one_at_a_time_rule(weights, seed):
    files = {name: 2 for name in "abc"[: len(weights)]}
    info = corpus(scratch_dir(), files, docs_per_file=30, mean_length=30)
    m = mixer(info, weights, seed=seed)
    got = mix(m, 120)
    # Each dataset's own order, read through a one-dataset mixer.
    singles = []
    acc = accesses(info)
    for d, a in enumerate(acc):
        s = TokenShareMixer(
            [RandomWalk(a, 0, 1, seed, Decoration())], [a.name], WeightSchedule.constant([1.0])
        )
        singles.append([(d, f, doc, dl) for _, f, doc, dl in mix(s, 120)])
    assert got == greedy_reference(singles, weights, 120)


@settings(max_examples=15)
@given(w=st.floats(0.1, 0.9), seed=st.integers(0, 50))
def test_token_shares_track_weights_within_one_percent(w, seed):
    info = corpus(scratch_dir(), {"a": 2, "b": 2}, docs_per_file=200, mean_length=20, spread=0.5)
    m = mixer(info, [w, 1 - w], seed=seed)
    docs = mix(m, 3000)
    tokens = np.zeros(2)
    for ds, _, _, dlen in docs:
        tokens[ds] += dlen
    assert abs(tokens[0] / tokens.sum() - w) < 0.01


def test_state_resumes_exactly(tmp_path):
    info = corpus(tmp_path, {"a": 2, "b": 3}, docs_per_file=30)
    reference = mix(mixer(info, [3, 1]), 150)
    for stop in (0, 1, 37, 149):
        head = mixer(info, [3, 1])
        mix(head, stop)
        resumed = mixer(info, [3, 1])
        resumed.load_state_dict(saved(head))
        assert mix(resumed, 150 - stop) == reference[stop:]


def test_mixed_lines_resume_and_rescale_exactly(tmp_path):
    """The mixer as the packer reads it, through the shared checker."""
    info = corpus(tmp_path, {"a": 4, "b": 4}, docs_per_file=30, mean_length=30)
    check_stage_resume(lambda: LinePacker(mixer(info, [3, 1]), 50), 100, (0, 3, 41, 99))
    check_stage_rescale(
        lambda sid: LinePacker(mixer(info, [3, 1], shard=sid, n_shards=4), 50), 4, 4, 2, 2
    )


def test_state_counts_tokens_per_dataset(tmp_path):
    info = corpus(tmp_path, {"a": 1, "b": 1}, docs_per_file=30)
    m = mixer(info, [1, 1])
    docs = mix(m, 20)
    state = m.state_dict()
    assert state["tokens"] == {
        "a": sum(d[3] for d in docs if d[0] == 0),
        "b": sum(d[3] for d in docs if d[0] == 1),
    }
    assert sum(s["docs"] for s in state["sources"].values()) == 20


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.data())
def test_range_totals_are_the_per_dataset_sums(n, data):
    """The mixer's commit (compiled) against a per-row count, for any range of a block."""
    rows = data.draw(st.integers(0, 50))
    ds = np.asarray(data.draw(st.lists(st.integers(0, n - 1), min_size=rows, max_size=rows)))
    dlen = np.asarray(data.draw(st.lists(st.integers(0, 10**6), min_size=rows, max_size=rows)))
    ds, dlen = ds.astype(np.int64), dlen.astype(np.int64)
    begin = data.draw(st.integers(0, rows))
    end = data.draw(st.integers(begin, rows))
    documents, tokens = np.full(n, 5, dtype=np.int64), np.full(n, 7, dtype=np.int64)
    _range_totals(ds, dlen, begin, end, documents, tokens)
    want_documents, want_tokens = [5] * n, [7] * n
    for i in range(begin, end):
        want_documents[int(ds[i])] += 1
        want_tokens[int(ds[i])] += int(dlen[i])
    assert documents.tolist() == want_documents and tokens.tolist() == want_tokens
