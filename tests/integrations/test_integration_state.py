"""fmsdata.integrations.ranks: the state every integration hands its trainer (every
data-parallel rank's, keyed by logical shard) resumes any rank on any data-parallel size,
is read strictly, and importing fmsdata never imports a trainer."""

import json
import subprocess
import sys

import pytest
import torch
from support import base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.integrations import ranks
from fmsdata.integrations.ranks import (
    FORMAT,
    carried_state,
    gather_rank_payloads,
    packed_union,
    resolve_dp,
)

TRAINER_MODULES = ("torchtitan", "olmo_core", "pytorch_lightning", "lightning")


@pytest.mark.slow  # a fresh interpreter
def test_importing_fmsdata_imports_no_trainer(tmp_path):
    """``import fmsdata``, ``fmsdata.integrations`` and a loader built and iterated leave
    every trainer package out of sys.modules."""
    info = corpus(tmp_path / "data")
    script = (
        "import json, sys\n"
        "import fmsdata, fmsdata.integrations, fmsdata.integrations.ranks\n"
        "from fmsdata import build_dataloader\n"
        "loader = build_dataloader(json.loads(sys.argv[1]), rank=0, world_size=1)\n"
        "next(iter(loader))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{TRAINER_MODULES!r})))\n"
    )
    config = json.dumps(base_config(info))
    done = subprocess.run(
        [sys.executable, "-c", script, config], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def _rows(batches):
    return sorted(row.numpy().tobytes() for batch in batches for row in batch["input_ids"])


def test_union_of_two_ranks_resumes_one_rank_exactly(tmp_path, monkeypatch):
    """States carried from 2 ranks (gathered, as a trainer's copy holds them) resume a
    1-rank loader on exactly the global steps the 2-rank run would have taken next."""
    info = corpus(tmp_path / "data")
    two = [build_dataloader(base_config(info, batch_size=2), rank=r, world_size=2) for r in (0, 1)]
    seen = [take(loader, 3) for loader in two]
    payloads = [
        {key: ranks._as_bytes(value) for key, value in loader.state_dict().items()}
        for loader in two
    ]
    monkeypatch.setattr(ranks, "gather_rank_payloads", lambda payload, r, w: payloads)
    carried = carried_state(two[0], 0, 2)
    assert carried == carried_state(two[1], 1, 2)  # the same entry on every rank
    assert set(carried) == {"format", "fmsdata_meta", *(f"fmsdata_shard_{s:05d}" for s in range(4))}
    # Plain data: it survives torch.save (how OLMo-core and Lightning write it) and loads
    # with weights_only=True, where no arbitrary object can be unpickled.
    torch.save(carried, tmp_path / "entry.pt")
    carried = torch.load(tmp_path / "entry.pt", weights_only=True)

    reference = take(build_dataloader(base_config(info, batch_size=4), rank=0, world_size=1), 6)
    for step in range(3):  # the 2-rank run so far is the 1-rank run's first 3 global steps
        assert _rows([seen[0][step], seen[1][step]]) == _rows([reference[step]])
    one = build_dataloader(base_config(info, batch_size=4), rank=0, world_size=1)
    one.load_state_dict(packed_union(carried, 4, "test"))
    resumed = take(one, 3)
    for step in range(3):
        assert torch.equal(resumed[step]["input_ids"], reference[3 + step]["input_ids"])

    # Each new rank of a 2-rank resume takes only its own shards from the same entry.
    again = [
        build_dataloader(base_config(info, batch_size=2), rank=r, world_size=2) for r in (0, 1)
    ]
    for loader in again:
        loader.load_state_dict(packed_union(carried, 4, "test"))
    nxt = [take(loader, 1)[0] for loader in again]
    assert _rows(nxt) == _rows([reference[3]])


def test_one_rank_without_process_group_carries_its_own_state(tmp_path):
    info = corpus(tmp_path / "data")
    loader = build_dataloader(base_config(info), rank=0, world_size=1)
    expected = take(build_dataloader(base_config(info), rank=0, world_size=1), 4)[2:]
    take(loader, 2)
    carried = carried_state(loader, 0, 1)
    fresh = build_dataloader(base_config(info), rank=0, world_size=1)
    fresh.load_state_dict(packed_union(carried, 4, "test"))
    got = take(fresh, 2)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(expected, got))


def test_gathering_needs_a_process_group_for_several_ranks():
    with pytest.raises(ConfigError, match="dp_world_size is 2 but torch.distributed"):
        gather_rank_payloads({}, 0, 2)


@pytest.mark.parametrize(
    ("rank", "size", "message"),
    [
        (2, 2, "dp_rank 2 is not valid for dp_world_size 2"),
        (0, 0, "dp_world_size 0"),
        (True, 2, "dp_rank must be an integer, got True"),
    ],
)
def test_bad_data_parallel_settings_are_refused(rank, size, message):
    with pytest.raises(ConfigError, match=message):
        resolve_dp(rank, size, "Somewhere")


def _entry():
    entry = {"format": FORMAT, "fmsdata_meta": b"{}"}
    entry.update({f"fmsdata_shard_{s:05d}": b"x" for s in range(4)})
    return entry


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda e: e.update(format="other/1"),
            r"where\.format: expected 'fmsdata-rank-states/1', got 'other/1'",
        ),
        (lambda e: e.pop("fmsdata_shard_00003"), r"missing \['fmsdata_shard_00003'\]"),
        (lambda e: e.update(fmsdata_shard_00009=b""), r"unexpected \['fmsdata_shard_00009'\]"),
        (
            lambda e: e.update(fmsdata_shard_00001=[1, 2]),
            r"where\.fmsdata_shard_00001: expected bytes, got list",
        ),
        (
            lambda e: e.update(fmsdata_meta=None),
            r"where\.fmsdata_meta: expected bytes, got NoneType",
        ),
    ],
)
def test_a_damaged_entry_is_refused_naming_the_field(change, message):
    entry = _entry()
    change(entry)
    with pytest.raises(StateMismatchError, match=message):
        packed_union(entry, 4, "where")


def test_an_entry_that_is_not_a_dict_is_refused():
    with pytest.raises(
        StateMismatchError, match="where: expected a dict of fmsdata loader states, got bytes"
    ):
        packed_union(b"PK", 4, "where")
