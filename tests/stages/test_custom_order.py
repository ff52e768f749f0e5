"""A document order of the user's own: one ``DocumentStream`` subclass (``walk_order``).

Checked against independent references: the corpus writer's documents (each epoch of a
shard reads its fragments' documents exactly once, in the order the subclass promises)
and the uninterrupted run (resume and rescale through the stage checker). A hook that
does not return a permutation is refused, naming the class and the dataset.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml
from chains import check_rotating_passes, recipe, take_documents, writer_order
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from stagecheck import check_stage_rescale, check_stage_resume
from support import accesses, base_config, corpus, delivered_truth, roundtrip, scratch_dir, take

from fmsdata import build_dataloader
from fmsdata.cli.main import main as cli
from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.stages import Decoration, DocumentStream, WalkOrder, walk
from fmsdata.stages.deal import file_deal_fits, shard_fragments
from fmsdata.state.file import save_state
from fmsdata.util.permute import derive_key, permute
from fmsdata.worker.chain import build_pipeline


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


class Tallied(FilesShuffled):
    """``FilesShuffled`` keeping a state key of its own: the documents it committed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.committed = 0

    def commit(self, rows):
        super().commit(rows)
        self.committed += max(rows, 0)

    def fresh_state(self):
        return {**super().fresh_state(), "committed": 0}

    def own_state(self):
        return {**super().own_state(), "committed": self.committed}

    def load_own_state(self, state):
        self.committed = int(state["committed"])
        super().load_own_state(state)


def tallied(shard):
    return shard.shuffle(shard.pack(shard.documents(Tallied)))


class NoOrder(DocumentStream):
    """Forgot ``walk_order``."""


def no_order(shard):
    return shard.pack(shard.documents(NoOrder))


def test_an_order_without_walk_order_is_refused_before_any_worker_starts(tmp_path):
    """Refused at the loader's first use, in the main process (its workers would only
    raise it later, and once per worker)."""
    info = corpus(tmp_path, {"a": 2}, docs_per_file=5)
    config = base_config(info, datasets=["a"], weights=[1], num_workers=1)
    loader = build_dataloader(config, stages=no_order)
    with pytest.raises(ConfigError, match="NoOrder does not define walk_order"):
        iter(loader)
    assert loader.worker_pids() == []


class NotAPermutation(DocumentStream):
    def walk_order(self, fragments, cycle):
        return WalkOrder(np.zeros(len(fragments), dtype=np.int64))


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
    # (A layout that leaves a shard without documents rotates: test_odd_files.py.)
    assume(file_deal_fits(counts, n_shards))
    for shard in range(n_shards):
        rows = shard_fragments(counts, n_shards, shard)
        mine = {(f, d) for f, lo, hi in rows.tolist() for d in range(lo, hi)}
        stream = order(access, shard, n_shards, seed, Decoration())
        size = len(mine)
        epochs = [take_documents(stream, size), take_documents(stream, size)]
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
        take_documents(again, k)
        resumed = order(access, shard, n_shards, seed, Decoration())
        resumed.load_state_dict(again.state_dict())
        assert take_documents(resumed, 2 * size - k) == (epochs[0] + epochs[1])[k:]


@settings(max_examples=15, deadline=None)
@given(
    order=st.sampled_from([FilesShuffled, Backwards]),
    n_shards=st.integers(2, 12),
    files=st.integers(1, 3),
    docs=st.integers(1, 12),
    seed=st.integers(0, 99),
    cut=st.integers(0, 60),
)
def test_a_small_dataset_rotates_under_any_order(order, n_shards, files, docs, seed, cut):
    """A dataset below a line per shard rotates: epoch ``e`` of each shard reads one portion.
    An order that permutes the whole cycle (across portions) still has every pass over the
    shards cover every document once (G4), and resumes anywhere exactly."""
    info = corpus(scratch_dir(), {"s": files}, docs_per_file=docs, mean_length=3)
    check_rotating_passes(info, order, n_shards, seed)
    access = accesses(info)[0]
    ref = writer_order(info, "s")
    sid = seed % n_shards
    whole = take_documents(order(access, sid, n_shards, seed, Decoration(), 10**6), 2 * len(ref))
    head = order(access, sid, n_shards, seed, Decoration(), 10**6)
    k = cut % (2 * len(ref))
    take_documents(head, k)
    resumed = order(access, sid, n_shards, seed, Decoration(), 10**6)
    resumed.load_state_dict(head.state_dict())
    assert take_documents(resumed, 2 * len(ref) - k) == whole[k:]


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


def stream_states(state):
    """``[(dataset, state)]`` of every per-dataset stream state in a loader ``state_dict``
    (a stream's state sits under its dataset's name and holds ``committed``)."""
    found = []

    def visit(node, key):
        if isinstance(node, dict):
            if "committed" in node and "pos" in node:
                found.append((key, node))
            for k, value in node.items():
                visit(value, k)
        elif isinstance(node, list):
            for value in node:
                visit(value, key)

    visit(state, None)
    return found


def test_a_mix_change_adds_a_dataset_under_an_order_with_state_of_its_own(tmp_path):
    """The added dataset's stream starts from its class's ``fresh_state`` (its own keys
    included), and the run goes on: the new dataset is read, the state saved again loads."""
    info = corpus(tmp_path, {"a": 2, "b": 2}, docs_per_file=30)
    config = base_config(info, datasets=["a"], weights=[1])
    loader = build_dataloader(config, stages=tallied)
    take(loader, 4)
    state = roundtrip(loader.snapshot())
    wider = {**config, "datasets": ["a", "b"], "weights": [1, 1], "allow_mix_change": True}
    resumed = build_dataloader(wider, stages=tallied)
    resumed.load_state_dict(state)
    take(resumed, 4)
    saved = roundtrip(resumed.snapshot())
    streams = stream_states(saved)
    assert {name for name, _ in streams} == {"a", "b"}
    assert all(s["committed"] == s["docs"] for _, s in streams)
    assert sum(s["docs"] for name, s in streams if name == "b") > 0, "b is read after the change"
    again = build_dataloader(wider, stages=tallied)
    again.load_state_dict(saved)
    take(again, 1)


def test_state_show_reads_a_custom_order_it_has_not_imported(tmp_path):
    """``fmsdata state show`` in a fresh process (the order's class not imported) counts
    exactly what was delivered: the stream's state is the base class's to report."""
    info = corpus(tmp_path / "data", docs_per_file=60)
    config = base_config(info, bos_token=None, eos_token=None)
    loader = build_dataloader(config, stages=tallied)
    batches = take(loader, 9)
    save_state(str(tmp_path / "state.fms"), loader.snapshot(settle=True))
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from fmsdata.cli.main import main; sys.exit(main())",
            "state",
            "show",
            str(tmp_path / "state.fms"),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    summary = json.loads(shown.stdout)
    assert summary["left_out"] is None
    got = {n: {"tokens": d["tokens"], "docs": d["docs"]} for n, d in summary["datasets"].items()}
    assert got == delivered_truth(info, config, batches)


class GivesAnArray(DocumentStream):
    def walk_order(self, fragments, cycle):
        return np.arange(len(fragments))


class NegativeKeys(DocumentStream):
    def walk_order(self, fragments, cycle):
        return WalkOrder(np.arange(len(fragments)), [-1] * len(fragments))


class FloatKeys(DocumentStream):
    def walk_order(self, fragments, cycle):
        return WalkOrder(np.arange(len(fragments)), [0.5] * len(fragments))


@pytest.mark.parametrize(
    "order, said",
    [
        (GivesAnArray, "GivesAnArray.walk_order must return a WalkOrder.*'a', got ndarray"),
        (NegativeKeys, "NegativeKeys.walk_order must give one integer key in \\[0, 2\\*\\*64\\)"),
        (FloatKeys, "FloatKeys.walk_order must give one integer key.*'a'"),
    ],
)
def test_a_walk_order_of_the_wrong_kind_is_refused_naming_class_and_dataset(order, said):
    info = corpus(scratch_dir(), {"a": 2}, docs_per_file=5)
    with pytest.raises(ConfigError, match=said):
        order(accesses(info)[0], 0, 1, 0, Decoration()).read_ahead()


class TalliedWithoutFresh(Tallied):
    """Keeps ``committed`` but forgot to extend ``fresh_state``."""

    def fresh_state(self):
        return DocumentStream.fresh_state(self)


def without_fresh(shard):
    return shard.shuffle(shard.pack(shard.documents(TalliedWithoutFresh)))


def test_an_order_with_state_of_its_own_and_no_fresh_state_is_told_to_define_it(tmp_path):
    info = corpus(tmp_path, {"a": 2, "b": 2}, docs_per_file=30)
    config = base_config(info, datasets=["a"], weights=[1])
    loader = build_dataloader(config, stages=without_fresh)
    take(loader, 2)
    wider = {**config, "datasets": ["a", "b"], "weights": [1, 1], "allow_mix_change": True}
    resumed = build_dataloader(wider, stages=without_fresh)
    resumed.load_state_dict(roundtrip(loader.snapshot()))
    with pytest.raises(ConfigError, match="TalliedWithoutFresh keeps state keys \\['committed'\\]"):
        take(resumed, 1)


class NumpySetting(FilesShuffled):
    def settings(self):
        return {**super().settings(), "flag": np.bool_(True)}


def numpy_setting(shard):
    return shard.pack(shard.documents(NumpySetting))


def test_a_setting_a_state_cannot_keep_is_refused_before_any_batch(tmp_path):
    info = corpus(tmp_path, {"a": 2}, docs_per_file=5)
    loader = build_dataloader(base_config(info, datasets=["a"], weights=[1]), stages=numpy_setting)
    with pytest.raises(ConfigError, match="NumpySetting: settings\\(\\)\\['flag'\\] is bool"):
        iter(loader)


def test_a_state_of_a_same_named_order_from_elsewhere_is_refused_naming_both(tmp_path):
    """A class defined in the script run (``__main__.Order``) and the same class imported
    from a module are different orders: the refusal says which is which."""
    info = corpus(tmp_path, {"a": 2}, docs_per_file=20)
    config = base_config(info, datasets=["a"], weights=[1])
    loader = build_dataloader(config, stages=tallied)
    take(loader, 2)
    Elsewhere = type("Tallied", (Tallied,), {"__module__": "__main__"})  # noqa: N806

    def elsewhere(shard):
        return shard.shuffle(shard.pack(shard.documents(Elsewhere)))

    resumed = build_dataloader(config, stages=elsewhere)
    with pytest.raises(StateMismatchError, match="test_custom_order.Tallied.*__main__.Tallied"):
        resumed.load_state_dict(roundtrip(loader.snapshot()))


def test_state_show_settles_a_custom_chain_it_is_told_of(tmp_path, capsys):
    """``--config`` with ``--stages MODULE:FUNCTION`` replays the lines in flight through
    the run's own chain: exact counts, nothing left out."""
    info = corpus(tmp_path / "data", docs_per_file=60)
    config = base_config(info, num_workers=1, bos_token=None, eos_token=None)
    loader = build_dataloader(config, stages=tallied)
    batches = take(loader, 9)
    save_state(str(tmp_path / "state.fms"), loader.snapshot())
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    show = ["state", "show", str(tmp_path / "state.fms"), "--json"]
    assert cli(show + ["--config", str(tmp_path / "config.yaml")]) != 0  # default chain: refused
    capsys.readouterr()
    assert (
        cli(show + ["--config", str(tmp_path / "config.yaml"), "--stages", f"{__name__}:tallied"])
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["left_out"] is None
    got = {n: {"tokens": d["tokens"], "docs": d["docs"]} for n, d in summary["datasets"].items()}
    assert got == delivered_truth(info, config, batches)
