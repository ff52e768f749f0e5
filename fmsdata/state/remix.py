"""Saved shard states carried over to a changed dataset list (``allow_mix_change``).

Each stage carries its own part over, with its inputs' (``Stage.carry_over``): the mixer
keeps the counts of the datasets kept, the streams of kept datasets go on, new ones
start and removed ones are dropped; stages holding spans renumber them from the saved
dataset numbering (``span_datasets``) to the new one. No chain is built: the stages are
walked as the fingerprint records them (``fmsdata.stages.savedchain``) and each stage's class is
asked about its own part.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fmsdata.stages.base import DatasetRenumbering
from fmsdata.stages.savedchain import held_spans, saved_stages, stage_types
from fmsdata.state.format import ShardEntry
from fmsdata.util.statecheck import within

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
                walked = saved_stages(stages, entry.state["stages"], _where(entry), types)
                used.update(np.unique(held_spans(walked)[:, 0]).tolist())
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
            # dataset then keeps, adds and drops whole carried-over inputs.
            for stage in reversed(saved_stages(stages, state["stages"], _where(entry), types)):
                cls = stage.known_class()
                inputs = {k: stage.node[k] for k in stage.inputs}
                with within(stage.where):
                    own, inputs = cls.carry_over(stage.own, inputs, change)
                stage.node.clear()
                stage.node.update(own)
                stage.node.update(inputs)
        out[sid] = dataclasses.replace(entry, state=state)
    return out, new_space


def _where(entry: ShardEntry) -> str:
    """Where an entry's state sat in what was loaded, for messages."""
    return entry.path or f"logical shard {entry.id}"
