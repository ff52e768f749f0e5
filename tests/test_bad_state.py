"""Damaged loader states: a StateMismatchError naming the path and the value, before any batch
is yielded — never an IndexError mid-iteration, never other lines (issue 18).

Loading reads the state's own fields and fingerprint; each shard's stages check their parts
when its chain is built and loaded, where it runs, before the first batch (issue 23)."""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import assert_same_batches, base_config, corpus, roundtrip, take

from fmsdata import build_dataloader
from fmsdata.errors import StateMismatchError


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A real saved state (with buffered lines and a packer carry) and what follows it."""
    info = corpus(tmp_path_factory.mktemp("data"))
    config = base_config(info)
    loader = build_dataloader(config)
    head = take(loader, 7)
    state = roundtrip(loader.snapshot())
    reference = take(build_dataloader(config), 7 + 4)
    assert_same_batches(reference[:7], head)
    return config, state, reference[7:]


def _shard(state, k=0):
    return state["shards"][k]["state"]["stages"]


def _find(node, role_key):
    """The first mapping inside ``node`` holding ``role_key`` (a stage's own state)."""
    if isinstance(node, dict):
        if role_key in node:
            return node
        for value in node.values():
            found = _find(value, role_key)
            if found is not None:
                return found
    return None


def _set(state, path, value):
    node = state
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _damaged(state, change):
    state = copy.deepcopy(state)
    change(state)
    return state


def _buffer(state):
    return _find(_shard(state), "buffer")["buffer"]


def _set_span(state, column, row, value):
    """Set one saved span field of the first shard's buffer (its column widened to int64:
    saved columns are as narrow as their values)."""
    buffer = _buffer(state)
    values = np.asarray(buffer[column], dtype=np.int64).copy()
    values[row] = value
    buffer[column] = values


def _mixer(state):
    return _find(_shard(state), "sources")


def _carry(state):
    return _find(_shard(state), "carry")


CASES = {
    "string fingerprint": (
        lambda s: s.update(fingerprint="abc"),
        r"^fingerprint: expected a mapping, got str 'abc'",
    ),
    "shards not a list": (lambda s: s.update(shards=5), r"^shards: expected a list, got int 5"),
    "missing buffer key": (
        lambda s: _find(_shard(s), "buffer").pop("buffer"),
        r"^shards\[0\]\.state\.stages: shuffle state: keys missing \['buffer'\]",
    ),
    "shard id out of range": (
        lambda s: s["shards"][1].update(id=99),
        r"^shards\[1\]\.id: .*logical shard 99, outside 0\.\.3",
    ),
    "negative walk position": (
        lambda s: _mixer(s)["sources"]["a"].update(pos=-1),
        r"^shards\[0\]\.state\.stages\..*sources\.a\.pos: must be at least 0, got -1",
    ),
    "walk position past the shard": (
        lambda s: _mixer(s)["sources"]["a"].update(pos=10_000),
        r"^shards\[0\]\.state\.stages\..*sources\.a\.pos: must be at most \d+, got 10000",
    ),
    "string count": (
        lambda s: _mixer(s)["tokens"].update(a="12"),
        r"^shards\[0\]\.state\.stages\..*tokens\.a: expected an integer, got str '12'",
    ),
    "negative count": (
        lambda s: _mixer(s)["sources"]["b"].update(docs=-5),
        r"sources\.b\.docs: must be at least 0, got -5",
    ),
    "negative advance": (
        lambda s: s["shards"][2].update(advance=-3),
        r"^shards\[2\]\.advance: must be at least 0, got -3",
    ),
    "negative steps": (lambda s: s.update(steps=-1), r"^steps: must be at least 0, got -1"),
    "span file past the dataset's files": (
        lambda s: _set_span(s, "file", 0, 99),
        r"^shards\[0\]\.state\.stages\.buffer\.file\[0\]: span \[\d+, 99, .*names file 99, "
        r"past the \d file\(s\) of its dataset",
    ),
    "span dataset past the dataset list": (
        lambda s: _set_span(s, "ds", 0, 7),
        r"^shards\[0\]\.state\.stages\.buffer\.ds\[0\]: names dataset 7, past the 2",
    ),
    "span document past the file": (
        lambda s: _set_span(s, "doc", 0, 5000),
        r"buffer\.doc\[0\]: span \[\d+, \d+, 5000, .* which holds 24",
    ),
    "span start past the document": (
        lambda s: _set_span(s, "start", 0, 5000),
        r"^shards\[0\]\.state\.stages\.buffer\.start\[0\]: span .* ends past its document",
    ),
    "negative span field": (
        lambda s: _set_span(s, "doc", 1, -4),
        r"buffer\.doc\[1\]: must be at least 0, got -4",
    ),
    "buffer saved by an older fmsdata": (
        lambda s: _find(_shard(s), "buffer").update(
            buffer={"spans": np.zeros((2, 5), dtype=np.int64), "offsets": np.array([0, 2])}
        ),
        r"^shards\[0\]\.state\.stages\.buffer: keys missing .* unexpected \['spans'\]",
    ),
    "carry of strings": (
        lambda s: _carry(s).update(carry=["x"] * 5),
        r"carry\[0\]: expected an integer, got str 'x'",
    ),
    "carry past the dataset's files": (
        lambda s: _carry(s).update(carry=[0, 50, 0, 0, 3]),
        r"saved span \[0, 50, 0, 0, 3\] .*names file 50",
    ),
    "skips not pairs": (
        lambda s: s.update(skips=[[3]]),
        r"^skips\[0\]: expected 2 items, got 1",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_damage_is_named_before_anything_runs(saved, case):
    config, state, _ = saved
    change, message = CASES[case]
    damaged = _damaged(state, change)
    loader = build_dataloader(config)
    yielded = []
    with pytest.raises(StateMismatchError, match=message):
        loader.load_state_dict(damaged)
        yielded.extend(take(loader, 1))
    assert yielded == []  # refused before any batch


def test_the_carry_exists_in_the_fixture(saved):
    _, state, _ = saved
    assert any(_find(e["state"]["stages"], "carry")["carry"] for e in state["shards"])
    assert len(_buffer(state)["doc"]) > 1


# -- every leaf of a real state, damaged in every way --------------------------------------


def _leaves(node, path=()):
    """Paths of every value inside a state, arrays' elements included."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path + (key,)
            yield from _leaves(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield path + (i,)
            yield from _leaves(value, path + (i,))
    elif isinstance(node, np.ndarray) and node.size:
        for index in np.ndindex(node.shape):
            yield path + (index,)


def _get(state, path):
    node = state
    for key in path:
        node = node[key]
    return node


DAMAGES = ("delete", "string", "none", "float", "negative", "list", "dict", "huge")


def _apply(state, path, damage):
    """Damage the value at ``path``; False when this damage does not apply there."""
    parent = _get(state, path[:-1])
    key = path[-1]
    value = parent[key]
    if isinstance(parent, np.ndarray):
        # Saved arrays are as narrow as their values: widen before damaging one.
        parent = parent.astype(np.int64)
        _get(state, path[:-2])[path[-2]] = parent
        if damage == "negative":
            parent[key] = -1 - int(value)
        elif damage == "huge":
            parent[key] = 10**9
        else:
            return False
        return True
    if damage == "delete":
        if not isinstance(parent, dict):
            return False
        del parent[key]
    elif damage == "string":
        parent[key] = "x"
    elif damage == "none":
        if value is None or path[-1] == "state":
            return False  # (a shard state None means "not started": valid, not detectable)
        parent[key] = None
    elif damage == "float":
        parent[key] = 0.5
    elif damage == "negative":
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        parent[key] = -1 - value
    elif damage == "list":
        parent[key] = [value]
    elif damage == "dict":
        parent[key] = {"x": value}
    elif damage == "huge":
        if isinstance(value, bool) or not isinstance(value, int) or "shards" not in path:
            return False
        counters = ("tokens", "base", "docs", "skipped", "epoch", "emitted", "advance")
        if any(k in counters for k in path):
            return False  # counts of what was read: any size is a valid value
        parent[key] = 10**9
    return True


def _names(path):
    """Words a message about ``path`` must contain (the last named key, or its owner)."""
    keys = [k for k in path if isinstance(k, str)]
    last = keys[-1] if keys else "shards"
    if path[0] == "fingerprint" and len(path) > 1:
        return (last, path[1], path[1].rstrip("s"))  # a field is compared as a whole
    if last in ("offsets", "carry", "tokens", "ds", "file", "doc", "start", "length"):
        return (last, "span")
    return (last,)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_damage_is_refused_with_its_path_or_changes_nothing(saved, data):
    config, state, reference = saved
    paths = list(_leaves(state))
    in_arrays = [p for p in paths if isinstance(p[-1], tuple)]
    plain = [p for p in paths if not isinstance(p[-1], tuple)]
    path = data.draw(st.sampled_from(plain) | st.sampled_from(in_arrays), label="path")
    damage = data.draw(st.sampled_from(DAMAGES), label="damage")
    damaged = copy.deepcopy(state)
    if not _apply(damaged, path, damage):
        return
    loader = build_dataloader(config)
    yielded = []
    try:
        loader.load_state_dict(damaged)
        for batch in loader:  # a shard's stages check their state before the first batch
            yielded.append(batch)
            if len(yielded) == len(reference):
                break
    except StateMismatchError as err:
        message = str(err)
        assert not yielded, (path, damage, "refused after a batch", message)
        assert any(word in message for word in _names(path)), (path, damage, message)
        return
    # Accepted: only harmless damage may be (the continuation is exactly the original one).
    assert_same_batches(reference, yielded)
