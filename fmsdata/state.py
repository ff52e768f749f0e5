"""The loader state: its layout, its fingerprint, and the replica of what was consumed.

A rank's state, as ``FmsDataLoader.snapshot()`` gives it, is plain nested data::

    {"version": 1,
     "fingerprint": {"data": ..., "seed": ..., "seq_length": ..., ...},
     "rank": r, "world_size": W, "steps": batches consumed,
     "skips": [[step, n], ...] (batches skipped over, and where),
     "span_datasets": [name, ...] (what the dataset field of saved spans refers to),
     "shards": [{"id": shard id,
                 "state": shard pipeline state or None (not started),
                 "advance": lines the shard emitted after that state}, ...]}

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

from fmsdata.config import LoaderConfig
from fmsdata.errors import StateMismatchError
from fmsdata.handlers.base import FileHandler
from fmsdata.stages.documents import fresh_stream_state
from fmsdata.stages.shuffle import apply_journal, pack_lines, unpack_lines
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
    "ConsumedState",
]

STATE_VERSION = 1
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

# Config fields that decide the lines of a logical shard (batch size, workers and world
# size do not: they may change between save and load).
MIX_FIELDS = (
    "datasets",
    "weights",
    "weight_schedule",
    "schedule_unit",
    "schedule_interpolation",
    "schedule_resolution",
    "global_batch_size",
)
_STREAM_FIELDS = (
    *MIX_FIELDS,
    "seq_length",
    "bos_token",
    "eos_token",
    "bol_token",
    "eol_token",
    "strip_tokens",
    "packing",
    "pad_token",
    "min_length",
    "logical_shards",
    "shuffle_window",
    "seed",
)


def stream_fingerprint(
    config: LoaderConfig, handler: FileHandler, names: Sequence[str], data: Mapping[str, str]
) -> dict[str, Any]:
    """What a saved state must agree with to be loaded: data hash and stream-shaping config."""
    values = config.to_dict()
    fingerprint: dict[str, Any] = {"data": dict(data)}
    for field in _STREAM_FIELDS:
        fingerprint[field] = values[field]
    fingerprint["datasets"] = list(names)
    fingerprint.update(handler.describe())
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
    if mix_change:
        saved_data, current_data = saved.get("data") or {}, current.get("data") or {}
        for name in sorted(set(saved_data) & set(current_data)):
            if saved_data[name] != current_data[name]:
                raise StateMismatchError(
                    f"the files of dataset {name!r} changed since the state was saved "
                    f"(data hash {saved_data[name]} became {current_data[name]})"
                )
        allowed.add("data")
    for field in sorted(set(saved) | set(current)):
        if field in allowed:
            continue
        if _plain(saved.get(field)) != _plain(current.get(field)):
            raise StateMismatchError(
                f"saved loader state has {field}={saved.get(field)!r} but this loader has "
                f"{field}={current.get(field)!r}"
            )


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


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
        check_keys_strict(key, body, ("state", "advance"))
        shards.append({"id": int(key[len(SHARD_PREFIX) :]), **body})
    return {**meta, "rank": -1, "shards": shards}


def check_keys_strict(where: str, value: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(value, Mapping) or set(value) != set(keys):
        found = sorted(value) if isinstance(value, Mapping) else type(value).__name__
        raise StateMismatchError(f"{where}: expected keys {sorted(keys)}, found {found}")


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


def _check_top(state: Any) -> None:
    if not isinstance(state, Mapping):
        raise StateMismatchError(f"a loader state must be a mapping, got {type(state).__name__}")
    missing = [k for k in TOP_KEYS if k not in state]
    if missing:
        raise StateMismatchError(f"loader state lacks {missing}; is this an fmsdata state?")
    if state["version"] != STATE_VERSION:
        raise StateMismatchError(
            f"loader state has version={state['version']!r}, "
            f"this fmsdata reads version={STATE_VERSION}"
        )


def mix_changed(saved: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether two fingerprints differ in the dataset list, weights or schedule."""
    return any(_plain(saved.get(f)) != _plain(current.get(f)) for f in MIX_FIELDS)


def remix_shard(
    state: dict[str, Any],
    mix: Sequence[str],
    old_space: Sequence[str],
    new_space: Sequence[str],
    rebase: bool,
) -> dict[str, Any]:
    """A shard state carried over to another dataset list (``mix``) and dataset numbering.

    Datasets kept continue from their own positions, new ones start at their beginning,
    removed ones are dropped. Saved spans are renumbered from ``old_space`` to
    ``new_space`` (lines of removed datasets still buffered stay readable through it).
    With ``rebase`` every share is measured afresh from here (``base`` moves to the
    tokens taken), so new weights hold from the resume on.
    """
    state = copy.deepcopy(state)
    mixer = state["source"]["source"]
    tokens = {name: int(mixer["tokens"].get(name, 0)) for name in mix}
    base = dict(tokens) if rebase else {name: int(mixer["base"].get(name, 0)) for name in mix}
    mixer["sources"] = {name: mixer["sources"].get(name, fresh_stream_state()) for name in mix}
    mixer["tokens"], mixer["base"] = tokens, base
    number = np.array(
        [new_space.index(n) if n in new_space else -1 for n in old_space], dtype=np.int64
    )
    spans = np.asarray(state["buffer"]["spans"], dtype=np.int64).copy()
    if len(spans):
        spans[:, 0] = number[spans[:, 0]]
    state["buffer"]["spans"] = spans
    carry = state["source"]["carry"]
    if carry:
        carry[0] = int(number[carry[0]])
    if (spans[:, 0] < 0).any() or (carry and carry[0] < 0):
        raise StateMismatchError(
            "a buffered line refers to a dataset missing from the new numbering"
        )
    return state


def span_names(states: Iterable[Any], space: Sequence[str]) -> set[str]:
    """Names of the datasets that buffered lines and carries of shard states point into."""
    used: set[str] = set()
    for state in states:
        if state is None:
            continue
        spans = np.asarray(state["buffer"]["spans"])
        used.update(space[int(i)] for i in np.unique(spans[:, 0]).tolist()) if len(spans) else None
        carry = state["source"]["carry"]
        if carry:
            used.add(space[int(carry[0])])
    return used


@dataclasses.dataclass
class Gathered:
    """What a set of saved rank states holds, ready for one rank to resume from."""

    shards: dict[int, tuple[Any, int]]
    steps: int
    skips: list[list[int]]
    fingerprint: dict[str, Any]
    span_datasets: list[str]


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
    steps = set()
    for state in states:
        _check_top(state)
        check_fingerprint(state["fingerprint"], fingerprint, allow, mix_change)
        steps.add(int(state["steps"]))
        for entry in state["shards"]:
            sid = int(entry["id"])
            if sid in shards:
                raise StateMismatchError(
                    f"logical shard {sid} appears in more than one saved state"
                )
            if not 0 <= sid < n_shards:
                raise StateMismatchError(
                    f"saved state names logical shard {sid}, outside 0..{n_shards - 1}"
                )
            if set(entry) != {"id", "state", "advance"}:
                raise StateMismatchError(
                    f"shard entry has keys {sorted(entry)}, expected ['advance', 'id', 'state']"
                )
            advance = int(entry["advance"])
            if advance < 0:
                raise StateMismatchError(f"logical shard {sid} has a negative advance {advance}")
            shards[sid] = (entry["state"], advance)
    if len(steps) > 1:
        raise StateMismatchError(f"the given states come from different steps {sorted(steps)}")
    first = states[0]
    skips = [[int(at), int(n)] for at, n in first["skips"]]
    return Gathered(
        shards, steps.pop(), skips, dict(first["fingerprint"]), list(first["span_datasets"])
    )


def _lines(spans: np.ndarray, offsets: np.ndarray) -> Iterator[np.ndarray]:
    for i in range(len(offsets) - 1):
        yield spans[offsets[i] : offsets[i + 1]]


class ConsumedState:
    """Per-shard pipeline state as of the last batch handed to the caller.

    Each shard is described by a state it passed through (``light`` + ``buffer``) and the
    number of lines it emitted since (``advance``); a shard's state moves forward when a
    worker item that advanced it has been consumed completely.

    Args:
        shard_ids: This rank's logical shards.
        entries: Saved ``{shard id: (state or None, advance)}``.
        steps: Batches consumed before (skipped ones included).
        skips: ``[step, batches]`` of every skip so far.
    """

    def __init__(
        self,
        shard_ids: Sequence[int],
        entries: Mapping[int, tuple[Any, int]] | None = None,
        steps: int = 0,
        skips: Sequence[Sequence[int]] = (),
    ):
        self.shard_ids = list(shard_ids)
        self.steps = steps
        self.skips = [[int(at), int(n)] for at, n in skips]
        self._light: dict[int, dict[str, Any] | None] = {}
        self._buffers: dict[int, list[np.ndarray]] = {}
        self._advance: dict[int, int] = {}
        for sid in self.shard_ids:
            state, advance = (entries or {}).get(sid, (None, 0))
            self._advance[sid] = int(advance)
            if state is None:
                self._light[sid] = None
                self._buffers[sid] = []
            else:
                self._light[sid] = copy.deepcopy({k: v for k, v in state.items() if k != "buffer"})
                self._buffers[sid] = unpack_lines(state["buffer"])

    def consume_batch(self, item: WorkerItem, batch: int) -> None:
        """Count the lines of batch ``batch`` of ``item`` as consumed."""
        for sid in item.row_shards[item.offsets[batch] : item.offsets[batch + 1]].tolist():
            self._advance[sid] += 1

    def finish_item(self, item: WorkerItem) -> None:
        """Move the shards ``item`` advanced to their state at its end (all of it consumed)."""
        self._light.update(item.lights)
        pushed = _lines(item.pushed, item.pushed_offsets)
        for sid, op in item.ops.tolist():
            apply_journal(self._buffers[sid], (op,), pushed)
        for sid in item.lights:
            self._advance[sid] = 0

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
        state = dict(light)
        state["buffer"] = pack_lines(self._buffers[sid])
        return state

    def shard_states(self) -> dict[int, Any]:
        return {sid: self.shard_state(sid) for sid in self.shard_ids}

    def advances(self) -> dict[int, int]:
        return dict(self._advance)
