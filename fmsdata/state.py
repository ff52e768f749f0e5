"""The loader state: its layout, its fingerprint, and the replica of what was consumed.

A rank's state, as ``FmsDataLoader.snapshot()`` gives it, is plain nested data::

    {"version": 3,
     "fingerprint": {"data": ..., "seed": ..., "seq_length": ..., ...},
     "rank": r, "world_size": W, "steps": batches consumed,
     "skips": [[step, n], ...] (batches skipped over, and where),
     "span_datasets": [name, ...] (what the dataset field of saved spans refers to),
     "shards": [{"id": shard id,
                 "state": shard pipeline state or None (not started),
                 "advance": lines the shard emitted after that state}, ...]}

A shard pipeline state is ``{"emitted": lines, "stages": the chain's state}``, the chain's
state nesting each stage's under its input key (``fmsdata.stages``). Nothing here knows
that nesting: the fingerprint's ``stages`` entry records each stage's path, type, role and
settings, and code looking for a stage's state finds it by role there (``stage_state``).

Shard states depend only on the shard, never on the rank, so a rescale is a regrouping of
the ``shards`` lists of all ranks. ``state_dict()`` gives the same content keyed by
logical shard, each entry one uint8 tensor (``pack_state``): that is what
``torch.distributed.checkpoint`` saves without pickling anything, and loading the union
of any ranks' dicts (or a DCP load keyed by the new owners' shards) rescales.

Workers run ahead of the training loop; the main process keeps a ``ConsumedState`` that
it advances with what the workers send (item-end shard states and the shuffle-buffer
journal, plus the lines consumed since), so the state describes exactly the batches handed
to the caller.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fmsdata.config import LoaderConfig, as_plain
from fmsdata.errors import StateMismatchError
from fmsdata.handlers.base import FileHandler
from fmsdata.stages.base import (
    DatasetRenumbering,
    Stage,
    held_spans,
    renumber_state,
)
from fmsdata.stages.savedlines import SavedLines, pack_lines, unpack_lines
from fmsdata.stages.shuffle import BUFFER_KEY, apply_journal
from fmsdata.statecheck import (
    fail,
    join,
    need_count,
    need_int,
    need_keys,
    need_list,
    need_mapping,
    within,
)
from fmsdata.statefile import state_from_bytes, state_to_bytes
from fmsdata.transport import WorkerItem

__all__ = [
    "STATE_VERSION",
    "META_KEY",
    "pack_state",
    "unpack_state",
    "as_rank_states",
    "stream_fingerprint",
    "check_fingerprint",
    "gather_shard_states",
    "mix_changed",
    "remix_shard",
    "span_names",
    "stage_state",
    "ConsumedState",
]

# 2: shard states are {"emitted", "stages"} with the fingerprint recording the chain.
# 3: shuffle buffers in narrow columns, spans to a document's end without their length
#    (``fmsdata.stages.savedlines``).
STATE_VERSION = 3
TOP_KEYS = (
    "version",
    "fingerprint",
    "rank",
    "world_size",
    "steps",
    "skips",
    "span_datasets",
    "shards",
)
META_KEY = "fmsdata_meta"
SHARD_PREFIX = "fmsdata_shard_"

# Config fields of the mix (what ``allow_mix_change`` lets differ; a resume replays the
# lines drawn with the old ones). Every other setting that shapes the lines is a stage's
# (``Stage.settings``), recorded per stage under ``stages``; batch size, workers and world
# size shape no line and may change between save and load.
MIX_FIELDS = (
    "datasets",
    "weights",
    "weight_schedule",
    "schedule_unit",
    "schedule_interpolation",
    "schedule_resolution",
    "global_batch_size",
)
# What every shard's walk is keyed by, outside any one stage.
_SHARD_FIELDS = ("logical_shards", "seed")
# Config fields that shape a shard's lines. Stages record them under their own names and
# as derived values (the packer's capacity is seq_length + 1 less the line delimiters), and
# their settings decide what must match; the fingerprint keeps these as configured too
# (under CONFIG_KEY), only so that a refused state is explained in the config's terms.
LINE_FIELDS = (
    "seq_length",
    "bos_token",
    "eos_token",
    "bol_token",
    "eol_token",
    "pad_token",
    "strip_tokens",
    "min_length",
    "packing",
    "shuffle_window",
    "document_order",
    "fim_training",
    "psm_rate",
    "spm_rate",
    "fim_pre",
    "fim_mid",
    "fim_suf",
    "fim_min_length",
)
CONFIG_KEY = "config"


def stream_fingerprint(
    config: LoaderConfig,
    handler: FileHandler,
    names: Sequence[str],
    data: Mapping[str, str],
    stages: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """What a saved state must agree with to be loaded: data hash, mix, shard keys, the
    handler's options and the chain's stages (``fmsdata.stages.base.layout``)."""
    values = config.to_dict()
    fingerprint: dict[str, Any] = {"data": dict(data)}
    for field in (*MIX_FIELDS, *_SHARD_FIELDS):
        fingerprint[field] = values[field]
    fingerprint["datasets"] = list(names)
    fingerprint.update(handler.describe())
    fingerprint["stages"] = [dict(stage) for stage in stages]
    fingerprint[CONFIG_KEY] = {field: as_plain(values[field]) for field in LINE_FIELDS}
    return fingerprint


def check_fingerprint(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    allow: Iterable[str] = (),
    mix_change: bool = False,
) -> None:
    """Raise StateMismatchError naming the first field that differs.

    Fields in ``allow`` may differ. With ``mix_change`` the dataset list, weights and
    schedule may too, and the data must match only for the datasets both sides have.
    """
    allowed = set(allow) | (set(MIX_FIELDS) if mix_change else set())
    if "datasets" not in allowed:
        _check_dataset_list(saved.get("datasets"), current.get("datasets"))
    if mix_change:
        saved_data, current_data = saved.get("data") or {}, current.get("data") or {}
        for name in sorted(set(saved_data) & set(current_data)):
            if saved_data[name] != current_data[name]:
                raise StateMismatchError(
                    f"the files of dataset {name!r} changed since the state was saved "
                    f"(data hash {saved_data[name]} became {current_data[name]})"
                )
        allowed.add("data")
    changed = _changed_config(saved.get(CONFIG_KEY), current.get(CONFIG_KEY))
    _check_stages(saved.get("stages"), current.get("stages"), allowed, mix_change, changed)
    for field in sorted(set(saved) | set(current)):
        if field in allowed or field in ("stages", CONFIG_KEY):
            continue
        if as_plain(saved.get(field)) != as_plain(current.get(field)):
            raise StateMismatchError(
                f"saved loader state has {field}={saved.get(field)!r} but this loader has "
                f"{field}={current.get(field)!r}" + (_ALLOW_MIX if field in MIX_FIELDS else "")
            )


_ALLOW_MIX = (
    "; to resume with a changed mix, set allow_mix_change: true (each dataset continues "
    "from its own position, added ones start at their beginning, removed ones are dropped)"
)


def _check_dataset_list(saved: Any, current: Any) -> None:
    """Name the datasets added or removed (or the new order) when the list changed."""
    if as_plain(saved) == as_plain(current) or not isinstance(saved, list):
        return
    current = list(current or [])
    added = [name for name in current if name not in saved]
    removed = [name for name in saved if name not in current]
    change = ", ".join(
        f"{what} {names}" for what, names in (("added", added), ("removed", removed)) if names
    )
    raise StateMismatchError(
        f"the datasets field changed since the state was saved: "
        f"{change or 'same datasets in another order'} (saved {saved}, now {current})" + _ALLOW_MIX
    )


def _changed_config(saved: Any, current: Any) -> str:
    """The line-shaping config fields that differ, as "the state was saved with X=a but
    this loader has X=b" ("" when the saved state records none: an older fmsdata)."""
    if not isinstance(saved, Mapping) or not isinstance(current, Mapping):
        return ""
    fields = [f for f in current if f in saved and as_plain(saved[f]) != as_plain(current[f])]
    if not fields:
        return ""
    before = ", ".join(f"{f}={saved[f]!r}" for f in fields)
    after = ", ".join(f"{f}={current[f]!r}" for f in fields)
    return f"the state was saved with {before} but this loader has {after}"


def _check_stages(
    saved: Any, current: Any, allowed: set[str], mix_change: bool, changed: str = ""
) -> None:
    """The same chain (stage types at the same paths) with the same settings; a differing
    setting is named with its stage, after the config fields that differ (``changed``)
    when the state records them. The mixer's dataset list may differ with a mix change."""

    def shape(stages: Any) -> list[tuple[Any, Any]]:
        if not isinstance(stages, list) or not all(isinstance(s, Mapping) for s in stages):
            raise StateMismatchError(f"fingerprint 'stages' must be a list of stages: {stages!r}")
        for i, stage in enumerate(stages):
            where = f"fingerprint.stages[{i}]"
            need_keys(stage, where, ("path", "stage", "role", "settings"))
            need_mapping(stage["settings"], f"{where}.settings")
        return [(as_plain(s.get("path")), s.get("stage")) for s in stages]

    if saved is None:
        raise StateMismatchError(
            "fingerprint.stages: the saved loader state records no stages "
            "(saved by an older fmsdata)"
        )
    if shape(saved) != shape(current):
        raise StateMismatchError(
            "the saved loader state comes from another chain of stages: saved "
            f"{_chain_text(saved)}, this loader runs {_chain_text(current)}"
        )
    for old, new in zip(saved, current):
        before, after = old.get("settings") or {}, new.get("settings") or {}
        for key in sorted(set(before) | set(after)):
            if key in allowed or (mix_change and new.get("role") == "mixer" and key == "datasets"):
                continue
            if as_plain(before.get(key)) != as_plain(after.get(key)):
                name = new.get("role") or new.get("stage")
                setting = (
                    f"stage {name!r} with {key}={before.get(key)!r} but this loader has "
                    f"{key}={after.get(key)!r}"
                )
                said = (
                    f"{changed} (saved {setting})"
                    if changed
                    else f"saved loader state has {setting}"
                )
                raise StateMismatchError(said)


def _chain_text(stages: list[Mapping[str, Any]]) -> str:
    return " <- ".join(str(s.get("stage", "?")).rsplit(".", 1)[-1] for s in stages)


def stage_state(shard_state: Any, fingerprint: Mapping[str, Any], role: str) -> Any:
    """The saved state of the stage with ``role`` inside a shard state (None when the
    shard has not started), found through the fingerprint's record of the chain."""
    if shard_state is None:
        return None
    for stage in fingerprint.get("stages") or []:
        if stage.get("role") == role and stage.get("path") is not None:
            node = shard_state["stages"]
            for key in stage["path"]:
                node = node[key]
            return node
    raise StateMismatchError(f"the saved chain has no stage with role {role!r}")


def pack_state(snapshot: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A rank snapshot as ``{"fmsdata_meta": ..., "fmsdata_shard_00042": ...}`` of uint8 tensors.

    The meta entry (JSON) holds what every rank shares: version, fingerprint, world size
    and steps; each shard entry is a state file (``fmsdata.statefile``) of one shard.
    """
    meta = {
        k: snapshot[k]
        for k in ("version", "fingerprint", "world_size", "steps", "skips", "span_datasets")
    }
    packed = {META_KEY: _bytes_tensor(json.dumps(meta, sort_keys=True).encode())}
    for entry in snapshot["shards"]:
        body = {"state": entry["state"], "advance": entry["advance"]}
        packed[f"{SHARD_PREFIX}{int(entry['id']):05d}"] = _bytes_tensor(state_to_bytes(body))
    return packed


def unpack_state(packed: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of ``pack_state`` (``rank`` is not kept: -1); parses, never unpickles."""
    try:
        meta = json.loads(_tensor_bytes(packed[META_KEY]).decode("utf-8"))
    except (KeyError, ValueError) as err:
        raise StateMismatchError(
            f"packed loader state has no readable {META_KEY!r} ({err})"
        ) from None
    shards = []
    for key, value in packed.items():
        if key == META_KEY:
            continue
        if not key.startswith(SHARD_PREFIX) or not key[len(SHARD_PREFIX) :].isdigit():
            raise StateMismatchError(f"packed loader state has an unknown entry {key!r}")
        body = state_from_bytes(_tensor_bytes(value), key)
        need_keys(body, key, ("state", "advance"))
        shards.append({"id": int(key[len(SHARD_PREFIX) :]), **body})
    return {**meta, "rank": -1, "shards": shards}


def as_rank_states(state: Any) -> list[Mapping[str, Any]]:
    """Snapshots from whatever a caller hands ``load_state_dict``: a snapshot, a packed
    state dict, or a list of either (the ranks of one save)."""
    items = list(state) if isinstance(state, (list, tuple)) else [state]
    if not items:
        raise StateMismatchError("no loader state given")
    out: list[Mapping[str, Any]] = []
    for item in items:
        if isinstance(item, Mapping) and META_KEY in item:
            out.append(unpack_state(item))
        else:
            out.append(item)
    return out


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _tensor_bytes(value: Any) -> bytes:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().numpy().tobytes()
    if isinstance(value, np.ndarray):
        return value.tobytes()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise StateMismatchError(f"packed loader state entry is a {type(value).__name__}, not bytes")


def _check_top(state: Any, path: str) -> None:
    """The rank-level fields of a saved state: present, of their types, in range."""
    if not isinstance(state, Mapping):
        raise fail(path, f"a loader state must be a mapping, got {type(state).__name__}")
    missing = [k for k in TOP_KEYS if k not in state]
    if missing:
        raise fail(path, f"loader state lacks {missing}; is this an fmsdata state?")
    if state["version"] != STATE_VERSION:
        raise fail(
            join(path, "version"),
            f"loader state has version={state['version']!r}, "
            f"this fmsdata reads version={STATE_VERSION}",
        )
    need_mapping(state["fingerprint"], join(path, "fingerprint"))
    need_int(state["world_size"], join(path, "world_size"), 1)
    need_count(state["steps"], join(path, "steps"))
    for i, skip in enumerate(need_list(state["skips"], join(path, "skips"))):
        at, n = need_list(skip, join(path, f"skips[{i}]"), 2)
        need_count(at, join(path, f"skips[{i}][0]"))
        need_int(n, join(path, f"skips[{i}][1]"), 1)
    for i, name in enumerate(need_list(state["span_datasets"], join(path, "span_datasets"))):
        if not isinstance(name, str):
            raise fail(join(path, f"span_datasets[{i}]"), f"expected a dataset name, got {name!r}")
    need_list(state["shards"], join(path, "shards"))


def mix_changed(saved: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether two fingerprints differ in the dataset list, weights or schedule."""
    return any(as_plain(saved.get(f)) != as_plain(current.get(f)) for f in MIX_FIELDS)


def remix_shard(
    chain: Stage,
    state: dict[str, Any],
    mix: Sequence[str],
    old_space: Sequence[str],
    new_space: Sequence[str],
    rebase: bool,
) -> dict[str, Any]:
    """A shard state carried over to another dataset list (``mix``) and dataset numbering.

    Each stage of ``chain`` (one built for the new config) carries its own part over
    (``Stage.renumber``): the mixer keeps the positions of the datasets kept, starts new
    ones and drops removed ones (with ``rebase`` measuring every share afresh from here);
    stages holding spans renumber them from ``old_space`` to ``new_space`` (lines of
    removed datasets still buffered stay readable through it).
    """
    number = np.array(
        [new_space.index(n) if n in new_space else -1 for n in old_space], dtype=np.int64
    )
    change = DatasetRenumbering(tuple(mix), number, rebase)
    return {
        "emitted": state["emitted"],
        "stages": renumber_state(chain, copy.deepcopy(state["stages"]), change),
    }


def span_names(chain: Stage, states: Iterable[Any], space: Sequence[str]) -> set[str]:
    """Names of the datasets that spans saved in shard states (buffered lines, carries,
    anything a stage holds) point into."""
    used: set[int] = set()
    for state in states:
        if state is not None:
            used.update(np.unique(held_spans(chain, state["stages"])[:, 0]).tolist())
    return {space[i] for i in used}


@dataclasses.dataclass
class Gathered:
    """What a set of saved rank states holds, ready for one rank to resume from."""

    shards: dict[int, tuple[Any, int]]
    steps: int
    skips: list[list[int]]
    fingerprint: dict[str, Any]
    span_datasets: list[str]
    paths: dict[int, str] = dataclasses.field(default_factory=dict)  # shard id -> its path


def gather_shard_states(
    states: Any,
    fingerprint: Mapping[str, Any],
    n_shards: int,
    allow: Iterable[str] = (),
    mix_change: bool = False,
) -> Gathered:
    """Collect the shard states of one rank's state or of every rank's states (snapshots,
    packed state dicts, or a list of either).

    Returns:
        A ``Gathered``: per shard id ``(state or None, lines consumed after it)``, the
        steps and skips of the save, and the fingerprint it was saved with.

    Raises:
        StateMismatchError: Version or fingerprint differ, a shard appears twice, or the
            states do not cover every logical shard.
    """
    states = as_rank_states(states)
    shards: dict[int, tuple[Any, int]] = {}
    paths: dict[int, str] = {}
    steps = set()
    for r, state in enumerate(states):
        path = f"states[{r}]" if len(states) > 1 else ""
        _check_top(state, path)
        check_fingerprint(state["fingerprint"], fingerprint, allow, mix_change)
        steps.add(int(state["steps"]))
        for k, entry in enumerate(state["shards"]):
            where = join(path, f"shards[{k}]")
            need_keys(entry, where, ("id", "state", "advance"))
            sid = need_count(entry["id"], join(where, "id"))
            if sid in shards:
                raise fail(
                    join(where, "id"), f"logical shard {sid} appears in more than one saved state"
                )
            if sid >= n_shards:
                raise fail(
                    join(where, "id"),
                    f"saved state names logical shard {sid}, outside 0..{n_shards - 1}",
                )
            advance = need_count(entry["advance"], join(where, "advance"))
            if entry["state"] is not None:
                need_keys(entry["state"], join(where, "state"), ("emitted", "stages"))
                need_count(entry["state"]["emitted"], join(where, "state.emitted"))
            shards[sid] = (entry["state"], advance)
            paths[sid] = join(where, "state")
    if len(steps) > 1:
        raise StateMismatchError(f"the given states come from different steps {sorted(steps)}")
    first = states[0]
    skips = [[int(at), int(n)] for at, n in first["skips"]]
    return Gathered(
        shards,
        steps.pop(),
        skips,
        dict(first["fingerprint"]),
        list(first["span_datasets"]),
        paths,
    )


def _at(state: Any, path: Sequence[str], buffer: bool = True) -> Any:
    """The mapping at ``path`` inside a shard state (with ``buffer``: it must hold the
    shuffle buffer)."""
    node = state
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            raise StateMismatchError(f"shard state has no {'.'.join(path)} (the shuffle buffer)")
        node = node[key]
    if not isinstance(node, Mapping) or (buffer and BUFFER_KEY not in node):
        raise StateMismatchError(f"shard state {'.'.join(path)} holds no {BUFFER_KEY!r}")
    return node


def _lines(spans: np.ndarray, offsets: np.ndarray) -> Iterator[np.ndarray]:
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        yield spans[a:b]


class ConsumedState:
    """Per-shard pipeline state as of the last batch handed to the caller.

    Each shard is described by a state it passed through (``light`` + the journaled
    shuffle buffer, kept here as lines: span arrays, or ints for lines of the buffer it
    was resumed with, still in their saved form) and the number of lines it emitted since
    (``advance``); a shard's state moves forward when a worker item that advanced it has
    been consumed completely.

    Args:
        shard_ids: This rank's logical shards.
        entries: Saved ``{shard id: (state or None, advance)}``.
        steps: Batches consumed before (skipped ones included).
        skips: ``[step, batches]`` of every skip so far.
        buffer_path: Where the journaled shuffle buffer's own state sits in a shard state
            (``ShardPipeline.buffer_path``; None: the chain journals nothing).
    """

    def __init__(
        self,
        shard_ids: Sequence[int],
        entries: Mapping[int, tuple[Any, int]] | None = None,
        steps: int = 0,
        skips: Sequence[Sequence[int]] = (),
        buffer_path: Sequence[str] | None = None,
    ):
        self.shard_ids = list(shard_ids)
        self.steps = steps
        self.skips = [[int(at), int(n)] for at, n in skips]
        self.buffer_path = None if buffer_path is None else tuple(buffer_path)
        self._light: dict[int, dict[str, Any] | None] = {}
        self._buffers: dict[int, list[np.ndarray | int]] = {}
        self._saved: dict[int, SavedLines] = {}  # the buffer each shard resumed with
        self._advance: dict[int, int] = {}
        self._replayed: dict[int, int] = {}  # see workers_start
        for sid in self.shard_ids:
            state, advance = (entries or {}).get(sid, (None, 0))
            self._advance[sid] = int(advance)
            self._buffers[sid] = []
            if state is None:
                self._light[sid] = None
                continue
            if self.buffer_path is not None:
                # Shallow copies down to the buffer, which leaves as lines: the deep copy of
                # the rest never copies the buffered spans.
                state = dict(state)
                node = state
                for key in self.buffer_path:
                    node[key] = dict(_at(node, (key,), buffer=False))
                    node = node[key]
                if BUFFER_KEY not in node:
                    raise StateMismatchError(
                        f"shard state {'.'.join(self.buffer_path)} holds no {BUFFER_KEY!r}"
                    )
                with within(".".join((*self.buffer_path, BUFFER_KEY))):
                    saved = unpack_lines(node.pop(BUFFER_KEY))
                self._saved[sid] = saved
                self._buffers[sid] = list(range(len(saved)))
            self._light[sid] = copy.deepcopy(state)

    def consume_batch(self, item: WorkerItem, batch: int) -> None:
        """Count the lines of batch ``batch`` of ``item`` as consumed."""
        for sid in item.row_shards[item.offsets[batch] : item.offsets[batch + 1]].tolist():
            self._advance[sid] += 1

    def workers_start(self) -> dict[int, int]:
        """Lines past each shard's state that workers starting now replay before their
        first line; the state they send with the shard's next item includes them."""
        self._replayed = dict(self._advance)
        return dict(self._advance)

    def finish_item(self, item: WorkerItem) -> None:
        """Move the shards ``item`` advanced to their state at its end (every batch of it
        consumed or skipped). Lines skipped past the item's end stay counted."""
        self._light.update(item.lights)
        pushed = _lines(item.pushed, item.pushed_offsets)
        ops = item.ops
        # One replay per run of a shard's ops (a worker sends each shard's ops together).
        cuts = [0, *(np.flatnonzero(np.diff(ops[:, 0])) + 1).tolist(), len(ops)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            if b > a:
                apply_journal(self._buffers[int(ops[a, 0])], ops[a:b, 1].tolist(), pushed)
        sids, counts = np.unique(item.row_shards, return_counts=True)
        in_item = dict(zip(sids.tolist(), counts.tolist()))
        for sid in item.lights:
            self._advance[sid] -= self._replayed.pop(sid, 0) + in_item.get(sid, 0)

    def advance_by(self, lines: Mapping[int, int]) -> None:
        """Count lines as consumed without their batches (a skip)."""
        for sid, n in lines.items():
            self._advance[sid] += n

    def emitted(self) -> list[int]:
        """Lines consumed so far from each of the rank's shards, in shard order."""
        counts = []
        for sid in self.shard_ids:
            light = self._light[sid]
            counts.append(self._advance[sid] + (0 if light is None else int(light["emitted"])))
        return counts

    def shard_state(self, sid: int) -> dict[str, Any] | None:
        light = self._light[sid]
        if light is None:
            return None
        if self.buffer_path is None:
            return light
        # Copy the dicts on the way to the buffer only: the rest is shared, read-only.
        state = dict(light)
        node = state
        for key in self.buffer_path:
            node[key] = dict(node[key])
            node = node[key]
        node[BUFFER_KEY] = pack_lines(self._buffers[sid], self._saved.get(sid))
        return state

    def shard_states(self) -> dict[int, Any]:
        return {sid: self.shard_state(sid) for sid in self.shard_ids}

    def advances(self) -> dict[int, int]:
        return dict(self._advance)
