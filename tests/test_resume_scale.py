"""Issue 23 item 4: a resume costs O(files + owned shards), not O(files x shards).

Counts, never times: the readers a resume opens (``FileHandler.open`` calls) before its
first batch. Today's code opened every file of a small dataset to decide whether it
rotates (once per chain built), and measured every buffered line's file twice; now the
decision comes from ``meta/counts.csv`` and a file is opened once per chain that reads it.
"""

import collections

import pytest
from support import assert_same_batches, base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.data import filecounts
from fmsdata.data.indexing import index_root
from fmsdata.handlers import ArrowDocHandler

FILES = 40  # per dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    info = corpus(tmp_path_factory.mktemp("data"), {"a": FILES, "b": FILES}, docs_per_file=160)
    index_root(info.root, ArrowDocHandler())
    return info


@pytest.fixture
def opens(monkeypatch):
    """Every reader opened, by path."""
    opened: collections.Counter[str] = collections.Counter()
    open_ = ArrowDocHandler.open

    def counted(self, path):
        opened[path] += 1
        return open_(self, path)

    monkeypatch.setattr(ArrowDocHandler, "open", counted)
    return opened


@pytest.mark.parametrize("shards", [8, 32])
def test_resume_opens_each_file_it_reads_a_bounded_number_of_times(data, opens, shards):
    config = base_config(data, logical_shards=shards, batch_size=4, shuffle_window=8)
    run = build_dataloader(config)
    take(run, 40)
    state = run.state_dict()
    reference = take(build_dataloader(config), 41)[40:]

    filecounts.forget_all()  # as in a fresh process
    opens.clear()
    resumed = build_dataloader(config)
    resumed.load_state_dict(state)
    assert_same_batches(reference, take(resumed, 1))
    # Not every file (nothing measures whole datasets), and no file once per shard: the
    # resume checks open a file once, the chain that then reads it once more.
    assert len(opens) < 2 * FILES, sorted(opens)
    assert max(opens.values()) <= 2, opens.most_common(3)
