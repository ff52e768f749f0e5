"""The one walk over a saved chain: each recorded stage with its part of a shard state.

A shard state holds the chain's state nested as the stages nest (``fmsdata.stages``:
each stage's own fields, and each input's state under the input's key); the state's
fingerprint records every stage's path in it, its type and role
(``fmsdata.stages.base.layout``). Code that works on saved states without building a
chain (``fmsdata state show``, a mix change on resume, the checks of a loaded state)
walks it here, and asks each stage's class about its own part (``Stage.held_spans``,
``Stage.carry_over``, ``Stage.report``): no stage's keys are read anywhere else, and no
stage object is made to be asked.

A stage type is looked up among the ``Stage`` classes this process has imported, never
imported by the name a state file gives (``stage_class``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fmsdata.errors import StateMismatchError
from fmsdata.stages.base import Stage
from fmsdata.stages.documents import DocumentStream
from fmsdata.stages.spans import SAVED_SPAN_WIDTH
from fmsdata.util.statecheck import fail, join, within

__all__ = ["SavedStage", "held_spans", "saved_stages", "stage_class", "stage_state", "stage_types"]


def stage_types() -> dict[str, type[Stage]]:
    """Every ``Stage`` class this process has imported, by ``module.qualname`` (what the
    fingerprint records)."""
    found: dict[str, type[Stage]] = {}
    pending: list[type[Stage]] = [Stage]
    while pending:
        cls = pending.pop()
        found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        pending.extend(cls.__subclasses__())
    return found


def stage_class(record: Mapping[str, Any], types: Mapping[str, type[Stage]]) -> type[Stage] | None:
    """The class that reads a recorded stage's own state: its type, when this process has
    imported it; else, for a dataset's stream (role ``"dataset"``), ``DocumentStream``: a
    subclass only orders the documents, the base class owns the state, its checks and its
    report (so ``fmsdata state show`` reads a state saved with a user's order without
    importing it). None: a type not imported here."""
    cls = types.get(str(record.get("stage")))
    if cls is None and record.get("role") == DocumentStream.role:
        return DocumentStream
    return cls


@dataclasses.dataclass(frozen=True)
class SavedStage:
    """One recorded stage of a saved chain and its part of a shard state.

    Attributes:
        record: What the fingerprint records of it (``path``, ``stage``, ``role``,
            ``settings``).
        cls: Its class here (None: a type this process has not imported).
        node: Its node in the shard state (own fields and its inputs' states).
        inputs: The keys of ``node`` its inputs' states are under.
        where: The node's path, for messages (``logical shard 3.stages.source``).
    """

    record: Mapping[str, Any]
    cls: type[Stage] | None
    node: dict[str, Any]
    inputs: tuple[str, ...]
    where: str

    @property
    def own(self) -> dict[str, Any]:
        """The stage's own part: its node less its inputs' states."""
        return {k: v for k, v in self.node.items() if k not in self.inputs}

    def known_class(self) -> type[Stage]:
        """``cls``, or a ``StateMismatchError`` naming the stage type not imported here."""
        if self.cls is None:
            raise fail(self.where, f"stage type {self.record.get('stage')!r} is not imported here")
        return self.cls

    @property
    def label(self) -> str:
        """How ``state show`` names it: the class name, and its path below the top."""
        path = list(self.record["path"])
        return str(self.record.get("stage", "?")).rsplit(".", 1)[-1] + (
            " at " + "/".join(path) if path else ""
        )


def saved_stages(
    stages: Sequence[Mapping[str, Any]],
    chain_state: Any,
    where: str = "",
    types: Mapping[str, type[Stage]] | None = None,
) -> list[SavedStage]:
    """Each stage of the recorded chain ``stages`` (top first) with its part of
    ``chain_state`` (a shard state's ``stages``).

    Raises:
        StateMismatchError: A recorded path missing from the state, or not a mapping there
            (named by its path under ``where``).
    """
    types = stage_types() if types is None else types
    paths = [tuple(stage["path"]) for stage in stages]
    out = []
    for record, path in zip(stages, paths):
        here = join(where, ".".join(("stages", *path)))
        node = chain_state
        for key in path:
            if not isinstance(node, dict) or key not in node:
                raise fail(here, f"keys missing [{key!r}]")
            node = node[key]
        if not isinstance(node, dict):
            raise fail(here, f"expected a mapping, got {type(node).__name__}")
        inputs = tuple(
            p[len(path)] for p in paths if len(p) == len(path) + 1 and p[: len(path)] == path
        )
        out.append(SavedStage(record, stage_class(record, types), node, inputs, here))
    return out


def held_spans(saved: Sequence[SavedStage]) -> np.ndarray:
    """Every span the stages' own parts hold (``[n, SAVED_SPAN_WIDTH]``; length 0: to the
    end of the document), each asked of its stage's class.

    Raises:
        StateMismatchError: A stage of a type not imported here.
    """
    parts = [np.zeros((0, SAVED_SPAN_WIDTH), dtype=np.int64)]
    for stage in saved:
        cls = stage.known_class()
        with within(stage.where):
            spans = np.asarray(cls.held_spans(stage.own), dtype=np.int64)
        parts.append(spans.reshape(-1, SAVED_SPAN_WIDTH))
    return np.concatenate(parts)


def stage_state(shard_state: Any, fingerprint: Mapping[str, Any], role: str) -> Any:
    """The saved state of the stage with ``role`` inside a shard state (None when the
    shard has not started), found through the fingerprint's record of the chain."""
    if shard_state is None:
        return None
    for stage in fingerprint.get("stages") or []:
        if stage.get("role") == role:
            node = shard_state["stages"]
            for key in stage["path"]:
                node = node[key]
            return node
    raise StateMismatchError(f"the saved chain has no stage with role {role!r}")
