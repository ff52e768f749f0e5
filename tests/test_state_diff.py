"""``fmsdata state diff A B``: what changed between two saved states, the delivered counts
checked against the token values of the batches between them."""

import json

import pytest
from support import base_config, corpus, delivered_truth, roundtrip, take

from fmsdata import build_dataloader
from fmsdata.cli.main import main
from fmsdata.cli.statediff import diff_states
from fmsdata.state.file import save_state


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("corpus"))


def states_of(loaders):
    return [roundtrip(loader.snapshot(settle=True)) for loader in loaders]


def test_delivered_counts_change_by_what_the_batches_between_hold(info):
    config = base_config(info, bos_token=None, eos_token=None)  # counts of stored tokens
    loaders = [build_dataloader(config, rank=r, world_size=2) for r in range(2)]
    first = [take(loader, 3) for loader in loaders]
    a = states_of(loaders)
    second = [take(loader, 4) for loader in loaders]
    loaders[0].skip(2)
    loaders[1].skip(2)
    b = states_of(loaders)
    diff = diff_states(a, b)
    assert diff["steps"] == {"a": 3, "b": 9, "change": 6}
    assert diff["skips_added"] == [[7, 2]]
    assert diff["settings"] == {} and diff["data_changed"] == []
    before = delivered_truth(info, config, [b for rank in first for b in rank])
    everything = delivered_truth(info, config, [b for r in range(2) for b in first[r] + second[r]])
    for name in ("a", "b"):
        tokens = diff["datasets"][name]["tokens"]
        assert tokens["a"] == before[name]["tokens"]
        # The skipped steps' lines count as delivered (passed over, as state show says).
        assert tokens["b"] >= everything[name]["tokens"]
        assert tokens["change"] == tokens["b"] - tokens["a"]
        assert diff["datasets"][name]["docs"]["a"] == before[name]["docs"]
    skipped = sum(diff["datasets"][name]["tokens"]["b"] for name in ("a", "b"))
    assert skipped == sum(everything[n]["tokens"] for n in ("a", "b")) + 2 * 2 * 4 * 33


def test_a_mix_change_and_other_data_are_named(info, tmp_path):
    config = base_config(info)
    loader = build_dataloader(config)
    take(loader, 2)
    a = states_of([loader])
    changed = build_dataloader({**config, "weights": [1.0, 3.0], "allow_mix_change": True})
    changed.load_state_dict(a)
    take(changed, 2)
    diff = diff_states(a, states_of([changed]))
    assert diff["settings"] == {"weights": {"a": [2.0, 1.0], "b": [1.0, 3.0]}}
    other = corpus(tmp_path / "other", seed=5)
    moved = build_dataloader(base_config(other))
    take(moved, 2)
    assert diff_states(a, states_of([moved]))["data_changed"] == ["a", "b"]


def test_the_command_prints_and_writes_json(info, tmp_path, capsys):
    config = base_config(info)
    loader = build_dataloader(config)
    take(loader, 2)
    save_state(tmp_path / "a.fms", loader.snapshot(settle=True))
    take(loader, 5)
    save_state(tmp_path / "b.fms", loader.snapshot(settle=True))
    assert main(["state", "diff", str(tmp_path / "a.fms"), str(tmp_path / "b.fms")]) == 0
    out = capsys.readouterr().out
    assert "steps: 2 -> 7 (+5)" in out and "delivered docs" in out
    argv = ["state", "diff", str(tmp_path / "a.fms"), str(tmp_path / "b.fms"), "--json"]
    assert main(argv) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff["steps"]["change"] == 5 and set(diff["datasets"]) == {"a", "b"}
