"""Every data-parallel rank's loader state in one entry whose keys depend on no rank.

fmsdata's loader state is per rank (the logical shards the rank owns). A trainer's
checkpoint may keep only one rank's copy of what the loader hands it: Lightning writes global
rank 0's dict; OLMo-core reads ``rank0.pt`` when a rank's own file is missing (another world
size); torch.distributed.checkpoint writes an entry whose key is equal on every rank once,
and requests at load exactly the keys the live loader reports. Any of these loses the
other ranks' shards, and a resume on another data-parallel size needs all of them. So an
integration hands its trainer the states of *every* data-parallel rank, gathered at
``state_dict()`` time, keyed by logical shard: the keys are the same on every rank and for
every data-parallel size (they depend only on ``logical_shards``). Whichever copy the
trainer keeps, each rank of a resumed run takes the shards it now owns from it.

The entry is the union of every rank's packed ``FmsDataLoader.state_dict()``, as bytes, plus
its format::

    {"format": "fmsdata-rank-states/1",
     "fmsdata_meta": b"{...}",              # JSON: version, fingerprint, steps, ...
     "fmsdata_shard_00000": b"PK...",       # one state file per logical shard
     ...,
     "fmsdata_shard_{L-1:05d}": b"PK..."}

Reading it parses JSON and state files (``fmsdata.state.file``: JSON and ``.npy`` headers
with ``allow_pickle=False``); nothing of fmsdata's is pickled. (The trainers' own checkpoint
writers serialize the dict with ``torch.save`` or DCP; that layer is theirs.)

Gathering uses ``torch.distributed.all_gather_object`` over the default group with plain
values (rank, size, a dict of bytes): ranks that share a data-parallel rank (tensor,
context or pipeline parallel peers) hold the same state, and one copy per data-parallel
rank is kept. Every process must therefore call ``state_dict()`` together, which all three
trainers do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.state.format import META_KEY, SHARD_PREFIX

__all__ = [
    "FORMAT",
    "carried_state",
    "gather_rank_payloads",
    "packed_union",
    "resolve_dp",
    "saved_union",
]

FORMAT = "fmsdata-rank-states/1"
_FORMAT_KEY = "format"


def resolve_dp(dp_rank: int, dp_world_size: int, where: str) -> tuple[int, int]:
    """Check a data-parallel rank and size handed over by a trainer.

    Raises:
        ConfigError: Not integers, size below 1 or rank outside ``0..size-1`` (names
            ``where`` the values came from and both values).
    """
    for name, value in (("dp_rank", dp_rank), ("dp_world_size", dp_world_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where}: {name} must be an integer, got {value!r}")
    if dp_world_size < 1 or not 0 <= dp_rank < dp_world_size:
        raise ConfigError(
            f"{where}: dp_rank {dp_rank} is not valid for dp_world_size {dp_world_size}"
        )
    return dp_rank, dp_world_size


def gather_rank_payloads(payload: Any, dp_rank: int, dp_world_size: int) -> list[Any]:
    """Every data-parallel rank's ``payload`` (plain data), indexed by data-parallel rank.

    Without ``torch.distributed`` (or with one data-parallel rank and no process group)
    only this rank's payload exists, which is enough only for a data-parallel size of 1.

    Raises:
        ConfigError: Several data-parallel ranks but no process group to gather over, or
            the gathered ranks disagree on the data-parallel size or miss a rank.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if dp_world_size != 1:
            raise ConfigError(
                f"dp_world_size is {dp_world_size} but torch.distributed is not initialized: "
                "the loader states of the other data-parallel ranks cannot be gathered"
            )
        return [payload]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (dp_rank, dp_world_size, payload))
    by_rank: dict[int, Any] = {}
    for process, item in enumerate(gathered):
        rank, size, data = item
        if size != dp_world_size:
            raise ConfigError(
                f"process {process} reports dp_world_size {size}, this one {dp_world_size}: "
                "every process must build its loader with the same data-parallel size"
            )
        by_rank.setdefault(rank, data)
    missing = sorted(set(range(dp_world_size)) - set(by_rank))
    if missing:
        raise ConfigError(
            f"no process reported data-parallel rank(s) {missing} of {dp_world_size}: "
            "the data-parallel ranks given to the loaders do not cover 0..dp_world_size-1"
        )
    return [by_rank[rank] for rank in range(dp_world_size)]


def carried_state(loader: Any, dp_rank: int, dp_world_size: int) -> dict[str, Any]:
    """The entry holding every data-parallel rank's state (see the module docstring).

    Args:
        loader: This rank's ``FmsDataLoader``.
        dp_rank: This rank's data-parallel rank.
        dp_world_size: The data-parallel size.

    Raises:
        ConfigError: The gathered states do not fit together (ranks at different steps,
            a logical shard owned twice): the loaders were not built alike.
    """
    mine = {key: _as_bytes(value) for key, value in loader.state_dict().items()}
    meta = mine[META_KEY]
    state: dict[str, Any] = {_FORMAT_KEY: FORMAT, META_KEY: meta}
    for rank, entries in enumerate(gather_rank_payloads(mine, dp_rank, dp_world_size)):
        if entries[META_KEY] != meta:
            raise ConfigError(
                f"data-parallel rank {rank}'s loader state differs from rank {dp_rank}'s in "
                f"its {META_KEY!r} (steps, fingerprint or world size): {entries[META_KEY]!r} "
                f"vs {meta!r}; every rank must build the loader alike and take the same steps"
            )
        for key, value in entries.items():
            if key == META_KEY:
                continue
            if key in state:
                raise ConfigError(f"logical shard entry {key!r} came from two ranks")
            state[key] = value
    return state


def packed_union(state: Any, logical_shards: int, where: str) -> dict[str, bytes]:
    """The union of every saved rank's packed state, from an entry written by
    ``carried_state``: what ``FmsDataLoader.load_state_dict`` takes to resume any rank.

    The entry is read strictly: exactly its format, its meta entry and one entry per
    logical shard ``0..logical_shards-1``, each holding bytes. (The contents are then read
    by the loader, which checks them against the data and config.)

    Args:
        state: What the trainer's checkpoint handed back.
        logical_shards: The loader's ``logical_shards``.
        where: Where it came from, for error messages (e.g. "Lightning checkpoint entry
            'FmsDataModule'").

    Raises:
        StateMismatchError: Naming ``where``, the field and the value found.
    """
    if not isinstance(state, Mapping):
        raise StateMismatchError(
            f"{where}: expected a dict of fmsdata loader states, got {type(state).__name__}"
        )
    found = state.get(_FORMAT_KEY)
    if found != FORMAT:
        raise StateMismatchError(
            f"{where}.{_FORMAT_KEY}: expected {FORMAT!r}, got {found!r} (not a state written "
            "by an fmsdata trainer integration, or from a newer fmsdata)"
        )
    shards = [f"{SHARD_PREFIX}{sid:05d}" for sid in range(logical_shards)]
    expected = {_FORMAT_KEY, META_KEY, *shards}
    if set(state) != expected:
        missing = sorted(expected - set(state))
        extra = sorted(str(key) for key in set(state) - expected)
        raise StateMismatchError(
            f"{where}: a state of logical_shards={logical_shards} must hold {_FORMAT_KEY!r}, "
            f"{META_KEY!r} and one entry per logical shard; missing {missing[:8]}, "
            f"unexpected {extra[:8]}"
        )
    union: dict[str, bytes] = {}
    for key in (META_KEY, *shards):
        value = state[key]
        if not isinstance(value, (bytes, bytearray)):
            raise StateMismatchError(f"{where}.{key}: expected bytes, got {type(value).__name__}")
        union[key] = bytes(value)
    return union


def saved_union(state: Any, where: str) -> dict[str, bytes]:
    """``packed_union`` of an entry whose ``logical_shards`` is not known beforehand (a tool
    reading a trainer's checkpoint): it is read from the entry's own meta, then the entry
    is checked as strictly as a loader checks it.

    Raises:
        StateMismatchError: Naming ``where``, the field and the value found.
    """
    if not isinstance(state, Mapping) or state.get(_FORMAT_KEY) != FORMAT:
        return packed_union(state, 1, where)  # raises: not a mapping, or not this format
    meta = state.get(META_KEY)
    if not isinstance(meta, (bytes, bytearray)):
        raise StateMismatchError(f"{where}.{META_KEY}: expected bytes, got {type(meta).__name__}")
    try:
        shards = json.loads(bytes(meta).decode("utf-8"))["fingerprint"]["logical_shards"]
    except (ValueError, KeyError, TypeError) as err:
        raise StateMismatchError(
            f"{where}.{META_KEY}: not the JSON of a loader state's meta entry ({err!r})"
        ) from None
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise StateMismatchError(
            f"{where}.{META_KEY}: fingerprint.logical_shards is {shards!r}, not a count"
        )
    return packed_union(state, shards, where)


def _as_bytes(value: Any) -> bytes:
    """A packed state entry (a uint8 tensor) as bytes."""
    return value.detach().cpu().contiguous().numpy().tobytes()
