"""Saved shard states carried over to another line length (``allow_changes=["seq_length"]``).

A long-context extension changes ``seq_length`` mid-run. Every document keeps its position
(the document streams and the mixer are left as they are: nothing read before the save is
read again or skipped); what the state holds as lines of the old length is re-packed at the
new one. The stages are walked top first, as the fingerprint records the chain
(``fmsdata.stages.savedchain``), and each stage's class carries its own part over
(``Stage.relength``): the shuffle buffer hands its lines' spans on and starts empty, the
packer takes them, before its own held spans, and packs them at the new length before its
next document (the hard or pad packer as its carry, the best-fit packer into its ready and
open lines). So the content the state held comes out first, in the order the stages held
it, then the stream goes on: a function of the shard's state alone, hence the same global
steps on any world size and number of workers, like every resume.

Shard states must be settled first (``advance`` 0: the lines emitted after a state were
made at the old length, and are replayed with it, ``fmsdata.loader.resume``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from fmsdata.errors import StateMismatchError
from fmsdata.stages.base import LineChange
from fmsdata.stages.savedchain import saved_stages, stage_types
from fmsdata.state.format import ShardEntry
from fmsdata.util.statecheck import within

__all__ = ["relength"]


def relength(
    entries: Mapping[int, ShardEntry],
    stages: Sequence[Mapping[str, Any]],
    settings: Mapping[tuple[str, ...], Mapping[str, Any]],
    documents: Any,
    old_seq_length: int,
    seq_length: int,
) -> dict[int, ShardEntry]:
    """Settled shard entries (``advance`` 0) carried over to lines of ``seq_length``.

    Args:
        entries: Shard entries saved at ``old_seq_length``, settled.
        stages: The chain as the saved fingerprint records it.
        settings: Each stage's settings in the chain resumed, by its path.
        documents: Finds the lengths of saved spans that run to their document's end
            (``fmsdata.stages.savedlines.DocumentLengths`` over the saved dataset numbering).
        old_seq_length, seq_length: The line lengths, for messages.

    Raises:
        StateMismatchError: A stage holds lines and cannot re-pack them, or no packer below
            takes the lines a stage handed on (a new run is needed).
    """
    types = stage_types()
    out = {}
    for sid, entry in entries.items():
        state = entry.state
        if state is not None:
            assert not entry.advance, "shard states are settled before a change of length"
            state = {"emitted": state["emitted"], "stages": copy.deepcopy(state["stages"])}
            change = LineChange(documents, old_seq_length, seq_length)
            where = entry.path or f"logical shard {sid}"
            for stage in saved_stages(stages, state["stages"], where, types):
                cls = stage.known_class()
                path = tuple(stage.record["path"])
                with within(stage.where):
                    own = cls.relength(stage.own, change, dict(settings.get(path, {})))
                for key in list(stage.node):
                    if key not in stage.inputs:
                        del stage.node[key]
                stage.node.update(own)
            if change.pieces:
                raise StateMismatchError(
                    f"{where}: the saved chain holds lines of seq_length={old_seq_length} that "
                    "no packer below them takes back to re-pack: this run cannot continue at "
                    f"seq_length={seq_length}; start a new run"
                )
        out[sid] = dataclasses.replace(entry, state=state)
    return out
