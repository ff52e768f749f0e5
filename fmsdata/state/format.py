"""The loader state's format: the one writer and the one reader of a saved loader state.

A rank's state, as plain nested data (``LoaderState.to_plain``, what
``FmsDataLoader.snapshot()`` gives)::

    {"version": 6,
     "fingerprint": {"data": ..., "seed": ..., "stages": [...], "writer": {...}, ...}
                    (fmsdata.state.fingerprint),
     "rank": r, "world_size": W, "steps": batches consumed,
     "skips": [[step, n], ...] (batches skipped over, and where),
     "span_datasets": [name, ...] (what the dataset field of saved spans refers to),
     "mix_feedback": None, or the weights as applied and the policy's state of a mix
                     that follows the training loss (fmsdata.state.mixrecord),
     "shards": [{"id": shard id,
                 "state": shard pipeline state or None (not started),
                 "advance": lines the shard emitted after that state}, ...]}

A shard pipeline state is ``{"emitted": lines, "stages": the chain's state}``, each stage's
nested under its input's key (``fmsdata.stages``). Only the stages read their own parts
(``load_own_state``, where the shard's chain runs, or their class's saved-state hooks);
the fingerprint records each stage's path, type and role, so the one walk over a saved
chain (``fmsdata.stages.savedchain``) finds each stage's part there.

Shard states depend only on the shard, never on the rank, so a rescale is a regrouping of
the ``shards`` lists of all ranks (``LoaderState.read`` then ``for_shards``). ``pack``
gives the same content keyed by logical shard, each entry one uint8 tensor: that is what
``torch.distributed.checkpoint`` saves without pickling anything, and the union of any
ranks' packed dicts (or a DCP load keyed by the new owners' shards) reads as one state.

Versions: 2 made shard states ``{"emitted", "stages"}`` with the fingerprint recording
the chain; 3 saves shuffle buffers in narrow columns, spans to a document's end without
their length (``fmsdata.stages.savedlines``); 4 records each dataset's document stream as
a stage of the chain (under the mixer's ``sources``, with the decoration settings the
mixer recorded before); 5 keeps the line writer's settings under the fingerprint's
``writer`` (before, a record in ``stages`` without a path). Shard states are the same in
3, 4 and 5: a version-3 state is read by rewriting its fingerprint's chain record as 4
has it (``_chain_of_v3``), a 3 or 4 by moving the writer's record (``_writer_of_v4``).
6 adds ``mix_feedback`` (a version-5 or older state has none: read as None).
Older versions are refused. Within versions 5 and 6, a hard or pad packer's ``carry``
holds several spans (5 ints each, one after another) only in a state saved after a
``seq_length`` change on resume and before the re-packed pieces are all in lines
(``fmsdata.stages.packing``); every other state is as before, and every earlier state
reads as before.

``mix_history_of`` reads the weights as applied from any saved form (what provenance
and ``state show`` read).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fmsdata.config import MixConfig, as_plain
from fmsdata.errors import StateMismatchError
from fmsdata.state.file import state_from_bytes, state_to_bytes
from fmsdata.state.fingerprint import WRITER_KEY, check_fingerprint
from fmsdata.state.mixrecord import MixRecord
from fmsdata.util.statecheck import (
    fail,
    join,
    need_count,
    need_int,
    need_keys,
    need_list,
    need_mapping,
)

__all__ = [
    "STATE_VERSION",
    "META_KEY",
    "SHARD_PREFIX",
    "ShardEntry",
    "LoaderState",
    "mix_history_of",
]

STATE_VERSION = 6
_READ_VERSIONS = (3, 4, 5, 6)  # how each older one reads: the module docstring
_FEEDBACK_KEY = "mix_feedback"  # added by version 6 (absent before: None)
# The mix fields version 6 added to the fingerprint (a feedback mix and its parameters).
_FEEDBACK_FIELDS = (
    "mix_policy mix_update_every odm_smoothing odm_exploration doremi_reference_losses "
    "doremi_step_size doremi_smoothing mix_policy_options"
).split()
TOP_KEYS = tuple("version fingerprint rank world_size steps skips span_datasets shards".split())
# The fields every rank of a save shares: the packed form's meta entry.
_META_FIELDS = (*(k for k in TOP_KEYS if k not in ("rank", "shards")), _FEEDBACK_KEY)
META_KEY = "fmsdata_meta"
SHARD_PREFIX = "fmsdata_shard_"


@dataclasses.dataclass(frozen=True)
class ShardEntry:
    """One logical shard's saved position.

    Attributes:
        id: The logical shard.
        state: Its pipeline state (None: not started), read by its chain where it runs.
        advance: Lines it emitted after ``state`` (replayed on resume).
        path: Where ``state`` sits in what was read, for messages (``shards[2].state``).
    """

    id: int
    state: dict[str, Any] | None
    advance: int = 0
    path: str = ""


@dataclasses.dataclass
class LoaderState:
    """A rank's loader state, or the union of several ranks' (``read``), checked strictly
    as it is read: every field present, of its type, in range, named by its path."""

    fingerprint: dict[str, Any]
    world_size: int
    steps: int
    skips: list[list[int]]
    span_datasets: list[str]
    shards: list[ShardEntry]
    rank: int = -1
    version: int = STATE_VERSION
    mix_feedback: MixRecord | None = None

    def to_plain(self) -> dict[str, Any]:
        """Plain nested data (the layout in the module docstring)."""
        return {
            "version": self.version,
            "fingerprint": self.fingerprint,
            "rank": self.rank,
            "world_size": self.world_size,
            "steps": self.steps,
            "skips": [list(skip) for skip in self.skips],
            "span_datasets": list(self.span_datasets),
            _FEEDBACK_KEY: None if self.mix_feedback is None else self.mix_feedback.to_plain(),
            "shards": [{"id": e.id, "state": e.state, "advance": e.advance} for e in self.shards],
        }

    @classmethod
    def from_plain(cls, value: Any, path: str = "") -> LoaderState:
        """Read one rank's plain state (``to_plain``); a packed one (``pack``) is unpacked.

        Raises:
            StateMismatchError: A field missing, of another type or out of range (named by
                its path under ``path``), or another version.
        """
        if isinstance(value, Mapping) and META_KEY in value:
            return cls.unpack(value)
        if not isinstance(value, Mapping):
            raise fail(path, f"a loader state must be a mapping, got {type(value).__name__}")
        missing = [k for k in TOP_KEYS if k not in value]
        if missing:
            raise fail(path, f"loader state lacks {missing}; is this an fmsdata state?")
        if value["version"] not in _READ_VERSIONS:
            raise fail(
                join(path, "version"),
                f"loader state has version={value['version']!r}, "
                f"this fmsdata reads versions {list(_READ_VERSIONS)}: no converter exists, "
                "continue the run with the fmsdata that saved it",
            )
        fingerprint = as_plain(need_mapping(value["fingerprint"], join(path, "fingerprint")))
        if value["version"] == 3:
            fingerprint = _chain_of_v3(fingerprint, join(path, "fingerprint.stages"))
        if value["version"] in (3, 4):
            fingerprint = _writer_of_v4(fingerprint, join(path, "fingerprint.stages"))
        if value["version"] < 6:
            fingerprint = _feedback_of_v5(fingerprint)
        _check_chain_record(fingerprint, join(path, "fingerprint"))
        skips = []
        for i, skip in enumerate(need_list(value["skips"], join(path, "skips"))):
            at, n = need_list(skip, where := join(path, f"skips[{i}]"), 2)
            skips.append([need_count(at, where + "[0]"), need_int(n, where + "[1]", 1)])
        names = need_list(value["span_datasets"], join(path, "span_datasets"))
        for i, name in enumerate(names):
            if not isinstance(name, str):
                raise fail(
                    join(path, f"span_datasets[{i}]"), f"expected a dataset name, got {name!r}"
                )
        shards = []
        for k, entry in enumerate(need_list(value["shards"], join(path, "shards"))):
            where = join(path, f"shards[{k}]")
            need_keys(entry, where, ("id", "state", "advance"))
            state = entry["state"]
            if state is not None:
                need_keys(state, join(where, "state"), ("emitted", "stages"))
                need_count(state["emitted"], join(where, "state.emitted"))
            shards.append(
                ShardEntry(
                    need_count(entry["id"], join(where, "id")),
                    state,
                    need_count(entry["advance"], join(where, "advance")),
                    join(where, "state"),
                )
            )
        if value["version"] == 3:
            _shard_states_of_v3(fingerprint["stages"], shards)
        feedback = None
        if value["version"] >= 6:
            if _FEEDBACK_KEY not in value:
                raise fail(path, f"loader state lacks {[_FEEDBACK_KEY]}")
            if value[_FEEDBACK_KEY] is not None:
                feedback = MixRecord.from_plain(value[_FEEDBACK_KEY], join(path, _FEEDBACK_KEY))
        rank = value["rank"]
        return cls(
            fingerprint,
            need_int(value["world_size"], join(path, "world_size"), 1),
            need_count(value["steps"], join(path, "steps")),
            skips,
            list(names),
            shards,
            rank if isinstance(rank, int) else -1,
            mix_feedback=feedback,
        )

    def pack(self) -> dict[str, torch.Tensor]:
        """``{"fmsdata_meta": ..., "fmsdata_shard_00042": ...}`` of uint8 tensors: the meta
        entry (JSON) holds what every rank shares (version, fingerprint, world size, steps,
        skips, span datasets, the feedback mix); each shard entry is a state file
        (``fmsdata.state.file``)."""
        plain = self.to_plain()
        meta = {k: plain[k] for k in _META_FIELDS}
        # Exact floats (repr round-trips) and no NaN: the feedback sums resume bit for bit.
        text = json.dumps(meta, sort_keys=True, allow_nan=False)
        packed = {META_KEY: _bytes_tensor(text.encode())}
        for entry in self.shards:
            body = {"state": entry.state, "advance": entry.advance}
            packed[f"{SHARD_PREFIX}{entry.id:05d}"] = _bytes_tensor(state_to_bytes(body))
        return packed

    @classmethod
    def unpack(cls, packed: Mapping[str, Any]) -> LoaderState:
        """Read what ``pack`` wrote (``rank`` is not kept: -1); parses, never unpickles."""
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
        if not isinstance(meta, dict):
            raise StateMismatchError(f"packed loader state's {META_KEY!r} is not a mapping")
        if meta.get("version") in (3, 4, 5):
            meta.pop(_FEEDBACK_KEY, None)
        return cls.from_plain({**meta, "rank": -1, "shards": shards})

    @classmethod
    def read(cls, given: Any, n_shards: int) -> LoaderState:
        """What a caller hands ``load_state_dict`` (a rank's state, plain or packed, or a
        list of every rank's) as one state holding every shard given.

        Raises:
            StateMismatchError: A rank's state does not read (``from_plain``), the ranks'
                steps or fingerprints differ, a shard appears twice or lies outside
                ``0..n_shards - 1``.
        """
        items = list(given) if isinstance(given, (list, tuple)) else [given]
        if not items:
            raise StateMismatchError("no loader state given")
        states = [
            cls.from_plain(item, f"states[{r}]" if len(items) > 1 else "")
            for r, item in enumerate(items)
        ]
        first = states[0]
        seen: set[int] = set()
        for r, state in enumerate(states):
            if state.steps != first.steps:
                steps = sorted({s.steps for s in states})
                raise StateMismatchError(f"the given states come from different steps {steps}")
            if state.fingerprint != first.fingerprint:
                raise StateMismatchError(
                    f"states[{r}].fingerprint differs from states[0]'s: the states come from "
                    "different runs"
                )
            if state.mix_feedback != first.mix_feedback:
                raise StateMismatchError(
                    f"states[{r}].mix_feedback differs from states[0]'s: every rank records "
                    "the same losses (record_loss on every rank, every step)"
                )
            for entry in state.shards:
                where = entry.path.removesuffix(".state") + ".id"
                if entry.id in seen:
                    raise fail(
                        where, f"logical shard {entry.id} appears in more than one saved state"
                    )
                if entry.id >= n_shards:
                    raise fail(
                        where,
                        f"saved state names logical shard {entry.id}, outside 0..{n_shards - 1}",
                    )
                seen.add(entry.id)
        if len(states) == 1:
            return first
        return dataclasses.replace(
            first, rank=-1, shards=[entry for state in states for entry in state.shards]
        )

    def check(
        self, current: Mapping[str, Any], allow: Iterable[str] = (), mix_change: bool = False
    ) -> bool:
        """Refuse a state saved from other data or another stream config; say whether its
        mix differs, as ``mix_change`` allows (``fmsdata.state.fingerprint.check_fingerprint``)."""
        return check_fingerprint(self.fingerprint, current, allow, mix_change)

    def for_shards(self, shard_ids: Sequence[int], rank: int) -> dict[int, ShardEntry]:
        """The entries of the logical shards ``shard_ids`` (a rank's), in their order.

        Raises:
            StateMismatchError: One of them is not in this state.
        """
        entries = {entry.id: entry for entry in self.shards}
        missing = [sid for sid in shard_ids if sid not in entries]
        if missing:
            raise StateMismatchError(
                f"the given state has no entry for logical shard(s) {missing} of rank "
                f"{rank}; to change world size, pass the states of every rank"
            )
        return {sid: entries[sid] for sid in shard_ids}


def mix_history_of(state: Any) -> list[tuple[int, list[float]]]:
    """The weights as applied, ``[(step, weights), ...]``, of a saved state (a
    ``LoaderState``, a rank's plain or packed state, or a list of them); empty when the
    run's weights did not follow its losses (``mix_policy`` unset).

    Raises:
        StateMismatchError: The state does not read (``LoaderState.from_plain``).
    """
    if isinstance(state, (list, tuple)):
        if not state:
            return []
        state = state[0]
    if not isinstance(state, LoaderState):
        state = LoaderState.from_plain(state)
    record = state.mix_feedback
    return [] if record is None else [(step, list(w)) for step, w in record.history]


_V3_DECORATION = ("bos", "eos", "strip", "min_length")
_V3_ORDERS = {
    "random": "fmsdata.stages.documents.RandomWalk",
    "sequential": "fmsdata.stages.documents.StoredOrder",
}


def _check_chain_record(fingerprint: Mapping[str, Any], where: str) -> None:
    """The fingerprint's record of the chain as a saved state must hold it (a list of
    stages, each with its path, type, role and settings; the line writer's settings), so
    the fingerprint's comparisons (``fmsdata.state.fingerprint``) read it without checks.

    Raises:
        StateMismatchError: Naming the field.
    """
    stages = fingerprint.get("stages")
    if stages is None:
        raise fail(join(where, "stages"), "records no stages (saved by an older fmsdata)")
    for i, stage in enumerate(need_list(stages, join(where, "stages"))):
        need_keys(stage, join(where, f"stages[{i}]"), ("path", "stage", "role", "settings"))
        need_list(stage["path"], join(where, f"stages[{i}].path"))
        need_mapping(stage["settings"], join(where, f"stages[{i}].settings"))
    need_mapping(fingerprint.get(WRITER_KEY), join(where, WRITER_KEY))


def _feedback_of_v5(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """A fingerprint saved before version 6 with the mix fields 6 added (``mix_policy``
    and its parameters) as their defaults: the run had fixed weights or a schedule."""
    added = {
        field.name: as_plain(field.default)
        for field in dataclasses.fields(MixConfig)
        if field.name in _FEEDBACK_FIELDS
    }
    return {**added, **fingerprint}


def _writer_of_v4(fingerprint: dict[str, Any], where: str) -> dict[str, Any]:
    """A version-3 or 4 fingerprint with the line writer's record (the one ``stages``
    entry without a path) moved to ``writer``, as 5 keeps it."""
    stages = need_list(fingerprint.get("stages"), where)
    writer = [s for s in stages if isinstance(s, Mapping) and s.get("path") is None]
    if len(writer) != 1:
        raise fail(where, f"expected one record of the line writer (no path), got {len(writer)}")
    settings = need_mapping(writer[0].get("settings"), where + ".settings")
    chain = [s for s in stages if not (isinstance(s, Mapping) and s.get("path") is None)]
    return {**fingerprint, "stages": chain, WRITER_KEY: dict(settings)}


def _chain_of_v3(fingerprint: dict[str, Any], where: str) -> dict[str, Any]:
    """A version-3 fingerprint with its chain recorded as version 4 records it: each
    built-in mixer's streams (not stages in 3) become its ``sources`` and one stage per
    dataset, taking the decoration and document order the mixer recorded, and the
    rotation threshold from the packer's capacity (what ``Shard.streams`` gives them)."""
    stages = need_list(fingerprint.get("stages"), where)
    capacity = next(
        (
            s["settings"].get("capacity", 0)
            for s in stages
            if isinstance(s, Mapping) and s.get("role") == "packer"
        ),
        0,
    )
    out: list[Any] = []
    for i, stage in enumerate(stages):
        if not (
            isinstance(stage, Mapping)
            and stage.get("stage") == "fmsdata.stages.mixing.TokenShareMixer"
        ):
            out.append(stage)
            continue
        settings = dict(need_mapping(stage.get("settings"), join(where, f"[{i}].settings")))
        order = settings.pop("document_order", "random")
        if order not in _V3_ORDERS:
            raise fail(join(where, f"[{i}].settings.document_order"), f"unknown order {order!r}")
        decoration = {key: settings.pop(key, None) for key in _V3_DECORATION}
        path = list(stage["path"])
        out.append({**stage, "settings": settings})
        out.append(
            {
                "path": [*path, "sources"],
                "stage": "fmsdata.stages.mixing.DatasetStreams",
                "role": None,
                "settings": {},
            }
        )
        for name in settings.get("datasets") or []:
            out.append(
                {
                    "path": [*path, "sources", name],
                    "stage": _V3_ORDERS[order],
                    "role": "dataset",
                    "settings": {"dataset": name, **decoration, "line_tokens": capacity},
                }
            )
    return {**fingerprint, "stages": out}


def _shard_states_of_v3(stages: Sequence[Any], shards: Sequence[ShardEntry]) -> None:
    """Version-3 shard states with what 4 keeps besides, in place: each dataset stream's
    ``tokens`` (the mixer counted them, and still does), and the per-dataset tables of a
    ``DocumentTransform`` (or subclass) added empty: its drops before the resume count in
    its totals only, not per dataset (what ``state show`` says); the lines are the same."""
    from fmsdata.stages.filter import DocumentTransform
    from fmsdata.stages.savedchain import stage_types

    types = stage_types()
    mixers, filters = [], []
    for s in stages:
        if not isinstance(s, Mapping) or s.get("path") is None:
            continue
        if s.get("stage") == "fmsdata.stages.mixing.TokenShareMixer":
            mixers.append(list(s["path"]))
        elif issubclass(types.get(str(s.get("stage")), object), DocumentTransform):
            filters.append(list(s["path"]))
    for entry in shards:
        if entry.state is None:
            continue
        for path in mixers:
            node = _node(entry.state["stages"], path)
            tokens = node.get("tokens") if isinstance(node, dict) else None
            sources = node.get("sources") if isinstance(node, dict) else None
            if isinstance(tokens, dict) and isinstance(sources, dict):
                for name, stream in sources.items():
                    if isinstance(stream, dict):
                        stream.setdefault("tokens", tokens.get(name, 0))
        for path in filters:
            node = _node(entry.state["stages"], path)
            if isinstance(node, dict):
                node.setdefault("datasets", [])
                node.setdefault("open", [])


def _node(state: Any, path: Sequence[str]) -> Any:
    """The part of a chain state at ``path`` (None where it is not there)."""
    for key in path:
        state = state.get(key) if isinstance(state, dict) else None
    return state


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
