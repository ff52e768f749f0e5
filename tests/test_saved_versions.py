"""States saved by earlier versions of fmsdata load and continue exactly.

``tests/fixtures/state_v<N>/`` holds, per earlier format version N, the states of 2 ranks
after 5 steps of the ``support.base_config`` loader over ``support.corpus`` (written by
``make_state_v<N>.py`` there, with the fmsdata that saved that version) and a digest of
the 4 global steps that followed when they were saved. Every shard has lines emitted
after its recorded state (``advance``), so a resume replays them too.
"""

import copy
import importlib
import json
import os
import sys

import pytest
import torch
from support import assert_same_batches, base_config, corpus, global_steps, rank_loaders, take

from fmsdata.state.file import load_state
from fmsdata.state.format import STATE_VERSION

HERE = os.path.join(os.path.dirname(__file__), "fixtures")
VERSIONS = (3, 4, 5)


def _fixtures(version):
    return os.path.join(HERE, f"state_v{version}")


def _expected(version):
    with open(os.path.join(_fixtures(version), "expected.json")) as handle:
        return json.load(handle)


def _digest(version):
    sys.path.insert(0, _fixtures(version))
    try:
        return importlib.import_module(f"make_state_v{version}").digest
    finally:
        sys.path.pop(0)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return base_config(corpus(tmp_path_factory.mktemp("data")))


def _states(version):
    world = _expected(version)["world_size"]
    return [load_state(os.path.join(_fixtures(version), f"rank{r}.state")) for r in range(world)]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_fixture_is_of_its_version_with_lines_to_replay(version):
    states = _states(version)
    assert version < STATE_VERSION
    assert [s["version"] for s in states] == [version] * len(states)
    assert all(entry["advance"] for s in states for entry in s["shards"])


@pytest.mark.parametrize("version", VERSIONS)
def test_saved_state_files_continue_exactly(config, version):
    expected = _expected(version)
    loaders = rank_loaders(config, expected["world_size"])
    for loader, state in zip(loaders, _states(version)):
        loader.load_state_dict(state)
        assert loader.steps == expected["steps_before"]
    after = [take(loader, expected["steps_after"]) for loader in loaders]
    assert _digest(version)(after) == expected["sha256"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_packed_state_dict_continues_as_the_state_file(config, version):
    expected = _expected(version)
    packed = torch.load(os.path.join(_fixtures(version), "rank0_state_dict.pt"), weights_only=True)
    from_packed, from_file = (rank_loaders(config, expected["world_size"])[0] for _ in range(2))
    from_packed.load_state_dict(packed)
    from_file.load_state_dict(_states(version)[0])
    n = expected["steps_after"]
    assert_same_batches(take(from_file, n), take(from_packed, n))


@pytest.mark.parametrize("version", VERSIONS)
def test_saved_states_of_two_ranks_rescale_to_one(config, version):
    expected = _expected(version)
    n, world = expected["steps_after"], expected["world_size"]
    two = rank_loaders(config, world)
    for loader, state in zip(two, _states(version)):
        loader.load_state_dict(state)
    (one,) = rank_loaders(config, 1, batch_size=world * config["batch_size"])
    one.load_state_dict(_states(version))
    assert global_steps([one], n) == global_steps(two, n)


def _drop_every_fifth(tokens, document_id):
    return document_id % 5 != 0


def _filtered(shard):
    from fmsdata.stages import DocumentFilter
    from fmsdata.stages.shard import default_stages

    return DocumentFilter(default_stages(shard), _drop_every_fifth)


def _as_v3(state):
    """A state of today as version 3 wrote it: the streams were not stages (their
    decoration and order sat in the mixer's settings), a filter kept no per-dataset
    tables, and the line writer's settings were a record without a path at the end of the
    chain's. The shard states' layout is otherwise the same."""
    state = copy.deepcopy(state)
    writer = state["fingerprint"].pop("writer")
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
    ] + [
        {
            "path": None,
            "stage": "fmsdata.worker.materialize.LineWriter",
            "role": "materialize",
            "settings": writer,
        }
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

    assert main(["state", "show", os.path.join(_fixtures(3), "rank0.state")]) == 0
    assert f"format version 3 (read as {STATE_VERSION})" in capsys.readouterr().out
