"""States saved in version 3 (by fmsdata at commit a49cdcb) load and continue exactly.

``tests/fixtures/state_v3/`` holds the states of 2 ranks after 5 steps of the
``support.base_config`` loader over ``support.corpus`` (see ``make_state_v3.py`` there) and
a digest of the 4 global steps that followed when they were saved. Every shard has lines
emitted after its recorded state (``advance``), so a resume replays them too.
"""

import copy
import json
import os
import sys

import pytest
import torch
from support import assert_same_batches, base_config, corpus, global_steps, rank_loaders, take

from fmsdata.statefile import load_state

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "state_v3")
sys.path.insert(0, FIXTURES)

from make_state_v3 import digest  # noqa: E402

with open(os.path.join(FIXTURES, "expected.json")) as _handle:
    EXPECTED = json.load(_handle)
WORLD = EXPECTED["world_size"]


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return base_config(corpus(tmp_path_factory.mktemp("data")))


def _states():
    return [load_state(os.path.join(FIXTURES, f"rank{r}.state")) for r in range(WORLD)]


def test_the_fixture_is_version_3_with_lines_to_replay():
    states = _states()
    assert [s["version"] for s in states] == [3] * WORLD
    assert all(entry["advance"] for s in states for entry in s["shards"])


def test_v3_state_files_continue_exactly(config):
    loaders = rank_loaders(config, WORLD)
    for loader, state in zip(loaders, _states()):
        loader.load_state_dict(state)
        assert loader.steps == EXPECTED["steps_before"]
    after = [take(loader, EXPECTED["steps_after"]) for loader in loaders]
    assert digest(after) == EXPECTED["sha256"]


def test_v3_packed_state_dict_continues_as_the_state_file(config):
    packed = torch.load(os.path.join(FIXTURES, "rank0_state_dict.pt"), weights_only=True)
    from_packed, from_file = (rank_loaders(config, WORLD)[0] for _ in range(2))
    from_packed.load_state_dict(packed)
    from_file.load_state_dict(_states()[0])
    n = EXPECTED["steps_after"]
    assert_same_batches(take(from_file, n), take(from_packed, n))


def test_v3_states_of_two_ranks_rescale_to_one(config):
    n = EXPECTED["steps_after"]
    two = rank_loaders(config, WORLD)
    for loader, state in zip(two, _states()):
        loader.load_state_dict(state)
    (one,) = rank_loaders(config, 1, batch_size=WORLD * config["batch_size"])
    one.load_state_dict(_states())
    assert global_steps([one], n) == global_steps(two, n)


def _drop_every_fifth(tokens, document_id):
    return document_id % 5 != 0


def _filtered(shard):
    from fmsdata.pipeline import default_stages
    from fmsdata.stages import DocumentFilter

    return DocumentFilter(default_stages(shard), _drop_every_fifth)


def _as_v3(state):
    """A version-4 state as version 3 wrote it: the streams were not stages (their
    decoration and order sat in the mixer's settings) and a filter kept no per-dataset
    tables. The shard states' layout is otherwise the same."""
    state = copy.deepcopy(state)
    stages = state["fingerprint"]["stages"]
    streams = [s for s in stages if s["role"] == "dataset"]
    order = {"RandomWalk": "random", "StoredOrder": "sequential"}
    for stage in stages:
        if stage["role"] == "mixer":
            settings = {k: streams[0]["settings"][k] for k in ("bos", "eos", "strip", "min_length")}
            settings["document_order"] = order[streams[0]["stage"].rsplit(".", 1)[1]]
            stage["settings"] = {**stage["settings"], **settings}
    state["fingerprint"]["stages"] = [
        s for s in stages if s["role"] != "dataset" and not s["stage"].endswith("DatasetStreams")
    ]
    for entry in state["shards"]:
        if entry["state"] is not None:
            node = entry["state"]["stages"]
            del node["datasets"], node["open"]
            mixer = node["source"]["source"]["source"]  # filter <- shuffle <- packer <- mixer
            for stream in mixer["sources"].values():
                del stream["tokens"]
    state["version"] = 3
    return state


@pytest.mark.parametrize("order", ["random", "sequential"])
def test_a_v3_state_with_a_filter_and_either_order_continues_exactly(config, order):
    from fmsdata import build_dataloader

    cfg = {**config, "document_order": order}
    loader = build_dataloader(cfg, rank=0, world_size=1, stages=_filtered)
    take(loader, 3)
    state = loader.snapshot()
    reference = take(loader, 4)
    old = _as_v3(state)
    assert old["fingerprint"] != state["fingerprint"]
    resumed = build_dataloader(cfg, rank=0, world_size=1, stages=_filtered)
    resumed.load_state_dict(old)
    assert_same_batches(reference, take(resumed, 4))


def test_state_show_says_a_v3_file_is_read_as_today(capsys):
    from fmsdata.cli.main import main

    assert main(["state", "show", os.path.join(FIXTURES, "rank0.state")]) == 0
    assert "format version 3 (read as 4)" in capsys.readouterr().out
