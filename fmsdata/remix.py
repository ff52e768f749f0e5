"""Saved shard states carried over to a changed dataset list (``allow_mix_change``).

Each stage carries its own part over (``Stage.renumber``) and, where it has one input per
dataset, its inputs (``Stage.renumber_inputs``): the mixer keeps the counts of the datasets
kept, the streams of kept datasets go on, new ones start and removed ones are dropped;
stages holding spans renumber them from the saved dataset numbering (``span_datasets``)
to the new one. No chain is built: the fingerprint records each stage's path and type,
and the types are looked up among the ``Stage`` classes this process imported
(``fmsdata.report``), asked on an instance made without ``__init__`` (``renumber`` and
``held_spans`` read only the state they are given).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fmsdata.loaderstate import ShardEntry
from fmsdata.report import stage_class, stage_types
from fmsdata.stages.base import SAVED_SPAN_WIDTH, DatasetRenumbering, Stage
from fmsdata.statecheck import fail, join, within

__all__ = ["remix"]


def remix(
    entries: Mapping[int, ShardEntry],
    stages: Sequence[Mapping[str, Any]],
    mix: Sequence[str],
    space: Sequence[str],
    rebase: bool,
) -> tuple[dict[int, ShardEntry], list[str]]:
    """Shard entries saved with the dataset numbering ``space``, carried over to ``mix``.

    Args:
        entries: Saved shard entries.
        stages: The chain as the saved fingerprint records it.
        mix: The datasets mixed from now on, in config order.
        space: What the saved spans' dataset field indexes (``span_datasets``).
        rebase: The weights changed: every share is measured afresh from here.

    Returns:
        The entries in the new numbering, and that numbering: ``mix``, then the datasets
        no longer mixed whose lines saved states still hold (readable until emitted).
    """
    types = stage_types()
    used: set[int] = set()
    if list(space) != list(mix):
        for entry in entries.values():
            if entry.state is not None:
                used.update(np.unique(_held(entry, stages, types)[:, 0]).tolist())
    gone = [name for i, name in enumerate(space) if i in used and name not in mix]
    new_space = [*mix, *gone]
    if not rebase and new_space == list(space):
        return dict(entries), new_space
    number = np.array([new_space.index(n) if n in new_space else -1 for n in space])
    change = DatasetRenumbering(tuple(mix), number.astype(np.int64), rebase)
    out = {}
    for sid, entry in entries.items():
        state = entry.state
        if state is not None:
            state = {"emitted": state["emitted"], "stages": copy.deepcopy(state["stages"])}
            # Inputs first (the recorded chain is top first): a stage with one input per
            # dataset then keeps, adds and drops whole renumbered inputs.
            for cls, node, own, where in reversed(list(_own_parts(entry, state, stages, types))):
                stage = cls.__new__(cls)
                inputs = {k: v for k, v in node.items() if k not in own}
                with within(where):
                    renumbered = stage.renumber(own, change)
                    carried = stage.renumber_inputs(inputs, change)
                node.clear()
                node.update(renumbered)
                node.update(carried)
        out[sid] = dataclasses.replace(entry, state=state)
    return out, new_space


def _held(
    entry: ShardEntry, stages: Sequence[Mapping[str, Any]], types: Mapping[str, type[Stage]]
) -> np.ndarray:
    """Every span the entry's stages hold (``[n, SAVED_SPAN_WIDTH]``)."""
    parts = [np.zeros((0, SAVED_SPAN_WIDTH), dtype=np.int64)]
    for cls, _, own, where in _own_parts(entry, entry.state, stages, types):
        with within(where):
            spans = np.asarray(cls.__new__(cls).held_spans(own), dtype=np.int64)
        parts.append(spans.reshape(-1, SAVED_SPAN_WIDTH))
    return np.concatenate(parts)


def _own_parts(
    entry: ShardEntry,
    state: Any,
    stages: Sequence[Mapping[str, Any]],
    types: Mapping[str, type[Stage]],
) -> Iterator[tuple[type[Stage], dict[str, Any], dict[str, Any], str]]:
    """Per recorded stage: its type, its node in ``state``, its own part of that node (the
    keys its inputs' states are not under) and the node's path for messages."""
    paths = [tuple(s["path"]) for s in stages if s.get("path") is not None]
    for stage in stages:
        if stage.get("path") is None:
            continue  # the line writer: not in the shard state
        path = tuple(stage["path"])
        where = join(entry.path or f"logical shard {entry.id}", ".".join(("stages", *path)))
        node = state["stages"]
        for key in path:
            if not isinstance(node, dict) or key not in node:
                raise fail(where, f"keys missing [{key!r}]")
            node = node[key]
        if not isinstance(node, dict):
            raise fail(where, f"expected a mapping, got {type(node).__name__}")
        cls = stage_class(stage, types)
        if cls is None:
            raise fail(where, f"stage type {stage.get('stage')!r} is not imported here")
        inputs = {p[len(path)] for p in paths if len(p) == len(path) + 1 and p[: len(path)] == path}
        yield cls, node, {k: v for k, v in node.items() if k not in inputs}, where
