"""G6: the state is plain, small data; the dataset pickles small; spawn works."""

import io
import json
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from support import assert_same_batches, base_config, corpus, roundtrip, take

from fmsdata import build_dataloader
from fmsdata.data.synthetic import write_corpus
from fmsdata.errors import StateMismatchError
from fmsdata.stages.savedchain import stage_state
from fmsdata.state.file import load_state, save_state, state_to_bytes

PLAIN = (int, float, str, bool, type(None))


def assert_plain(value, where="state"):
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str), f"{where}: key {k!r}"
            assert_plain(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            assert_plain(v, f"{where}[{i}]")
    elif isinstance(value, np.ndarray):
        assert value.dtype.kind in "iu", f"{where}: array of {value.dtype}"
    else:
        assert isinstance(value, PLAIN), f"{where}: {type(value).__name__}"


def test_state_is_plain_data(tmp_path):
    info = corpus(tmp_path)
    loader = build_dataloader(base_config(info, num_workers=1))
    take(loader, 7)
    state = loader.snapshot()
    assert_plain(state)
    assert_plain(loader.snapshot(settle=True))
    again = roundtrip(state)
    assert_plain(again)


def test_state_file_holds_only_json_and_npy_and_never_unpickles(tmp_path):
    info = corpus(tmp_path / "d")
    loader = build_dataloader(base_config(info))
    take(loader, 3)
    path = tmp_path / "s.fms"
    save_state(path, loader.snapshot())
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    assert names[0] == "state.json" and all(n.endswith(".npy") for n in names[1:])
    # A crafted file whose array is a pickle is refused, not executed.
    evil = io.BytesIO()
    np.save(evil, np.array([object()], dtype=object), allow_pickle=True)
    crafted = tmp_path / "evil.fms"
    with zipfile.ZipFile(crafted, "w") as archive:
        archive.writestr("state.json", '{"x": {"__array__": "a0"}}')
        archive.writestr("a0.npy", evil.getvalue())
    with pytest.raises(StateMismatchError, match="evil.fms"):
        load_state(crafted)


def test_the_same_state_gives_the_same_bytes_at_any_time(tmp_path, monkeypatch):
    import time

    info = corpus(tmp_path / "d")
    loader = build_dataloader(base_config(info))
    take(loader, 3)
    first = state_to_bytes(loader.snapshot())
    later = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: later)
    assert state_to_bytes(loader.snapshot()) == first


def test_state_size_does_not_grow_with_the_tokens_in_the_buffer(tmp_path):
    info = write_corpus(tmp_path, {"a": 2}, docs_per_file=40, mean_length=20_000, spread=0.3)
    sizes = {}
    for seq in (512, 4096):
        config = dict(
            data_path=info.root,
            seq_length=seq,
            batch_size=2,
            logical_shards=2,
            shuffle_window=20,
            eos_token=0,
        )
        loader = build_dataloader(config)
        take(loader, 20)
        state = loader.snapshot(settle=True)
        buffers = [
            stage_state(e["state"], state["fingerprint"], "shuffle") for e in state["shards"]
        ]
        lines = sum(len(b["buffer"]["offsets"]) - 1 for b in buffers)
        assert lines >= 38  # both buffers full
        sizes[seq] = len(state_to_bytes(state))
    # Eight times the tokens per line, about the same bytes: lines are spans, not tokens.
    assert sizes[4096] < 1.5 * sizes[512], sizes
    assert sizes[4096] < 20 * 1024


def test_dataset_pickles_small_before_iteration(tmp_path):
    info = write_corpus(tmp_path, {"a": 300, "b": 300}, docs_per_file=2, mean_length=5)
    loader = build_dataloader(dict(data_path=info.root, seq_length=16, logical_shards=64))
    assert len(pickle.dumps(loader.dataset)) < 1_000_000
    assert len(pickle.dumps(loader.dataset)) < 20_000  # the file list is not in it


@pytest.mark.slow
def test_spawn_workers_give_the_same_batches(tmp_path):
    """Spawned workers get the ring by pickling: the same batches, and a state (the
    shards' states they sent) that resumes exactly."""
    info = corpus(tmp_path)
    reference = take(build_dataloader(base_config(info)), 18)
    spawned = build_dataloader(base_config(info, num_workers=2, multiprocessing_context="spawn"))
    assert_same_batches(reference[:12], take(spawned, 12))
    resumed = build_dataloader(base_config(info))
    resumed.load_state_dict(roundtrip(spawned.snapshot()))
    assert_same_batches(reference[12:], take(resumed, 6))


def _worker_memory(loader, root=None):
    """The worker's anonymous resident bytes and its resident bytes of file mappings (of
    files under ``root`` only, when given: the shard files, not the libraries a worker maps
    as it goes, such as the compiler's when its kernels compile)."""
    (pid,) = loader.worker_pids()
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    anon = int(fields["RssAnon"].split()[0]) * 1024
    if root is None:
        return anon, int(fields["RssFile"].split()[0]) * 1024
    mapped, inside = 0, False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:  # a mapping's line
                inside = len(head) >= 6 and head[5].startswith(str(root))
            elif inside and line.startswith("Rss:"):
                mapped += int(head[1]) * 1024
    return anon, mapped


# Run in a fresh interpreter: a worker forked from a process that ran other tests first
# inherits its mappings, and their pages, touched again, blurred the figures.
_FLAT_RUN = """
import json, sys
import fmsdata.worker.dataset
from fmsdata import build_dataloader
from fmsdata.data.synthetic import write_corpus
sys.path.insert(0, sys.argv[2])
from test_state import _worker_memory

# A small budget for mapped shard pages, so a small corpus shows the effect.
fmsdata.worker.dataset.MAPPED_BUDGET = 4 << 20
info = write_corpus(sys.argv[1], {"a": 8, "b": 8}, docs_per_file=200, mean_length=4000)
config = dict(
    data_path=info.root, seq_length=1024, batch_size=8, logical_shards=8, shuffle_window=8,
    eos_token=0, num_workers=1, multiprocessing_context="fork",
)
iterator = iter(loader := build_dataloader(config))
next(iterator)
anon_start, mapped_start = _worker_memory(loader, info.root)
for _ in range(400):
    next(iterator)
anon_early, _ = _worker_memory(loader, info.root)
for _ in range(1600):
    next(iterator)
anon_late, mapped_late = _worker_memory(loader, info.root)
print(json.dumps([anon_early, anon_late, mapped_start, mapped_late]))
"""


@pytest.mark.slow
def test_worker_memory_stays_flat_over_a_long_run(tmp_path):
    tests = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(
        [sys.executable, "-c", _FLAT_RUN, str(tmp_path), tests],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    anon_early, anon_late, mapped_start, mapped_late = json.loads(done.stdout.splitlines()[-1])
    corpus_bytes = sum(p.stat().st_size for p in tmp_path.rglob("*.arrow"))
    assert 2000 * 8 * 1024 * 4 > corpus_bytes > 40 << 20  # the run read all of a 40+ MB corpus
    assert anon_late - anon_early < 16 << 20, (anon_early, anon_late)
    # Shard pages read through the maps are given back: what stays resident is the budget
    # plus at most one item's worth (2M tokens), not the corpus.
    assert mapped_late - mapped_start < 16 << 20, (mapped_start, mapped_late)


def test_state_dict_is_tensors_keyed_by_logical_shard(tmp_path):
    import torch

    info = corpus(tmp_path)
    config = base_config(info, logical_shards=4)
    loaders = [build_dataloader(config, rank=r, world_size=2) for r in range(2)]
    for loader in loaders:
        take(loader, 5)
    packed = [loader.state_dict() for loader in loaders]
    assert set(packed[0]) == {"fmsdata_meta", "fmsdata_shard_00000", "fmsdata_shard_00001"}
    assert all(v.dtype == torch.uint8 and v.dim() == 1 for v in packed[0].values())
    # The union of two ranks' dicts is the state of the whole run: one rank resumes it.
    whole = {**config, "batch_size": 8}  # the global batch of the two ranks
    reference = take(build_dataloader(whole, rank=0, world_size=1), 8)
    merged = build_dataloader(whole, rank=0, world_size=1)
    merged.load_state_dict({**packed[0], **packed[1]})
    assert_same_batches(reference[5:], take(merged, 3))
