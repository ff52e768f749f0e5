"""At which steps a document's tokens were delivered (``fmsdata trace --doc``).

A document is read only by the logical shards whose fragments hold it
(``DocumentStream.reads``): one shard, unless its dataset is small enough to rotate over
every shard. So the walk follows those shards alone: their lines are pulled at span level,
each line holding the document is told as a row (through the token stages), and the
deal says which step, rank and row each line became.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Protocol

import numpy as np

from fmsdata.errors import ConfigError
from fmsdata.stages.base import walk
from fmsdata.trace.origin import Origin
from fmsdata.trace.rows import RowTrace
from fmsdata.trace.walker import StepWalker, line_tracer
from fmsdata.worker.chain import build_pipeline

__all__ = ["DocumentTrace", "trace_document", "find_document"]

_FLUSH_LINES = 4096  # lines a walk deals before it pulls and scans them


@dataclasses.dataclass
class DocumentTrace:
    """Where one document's tokens went, up to a step.

    Attributes:
        dataset, file, doc: The document (``file`` relative to the data root).
        until: The last step looked at.
        seen: Each delivery: ``{"step", "rank", "row", "start", "length", "at"}`` (a
            piece: its first token in the document, its token count, its position in
            the row), by step.
        passed_over: Pieces in steps a skip passed over (consumed, not trained on).
        dropped: Pieces a token stage took out of their row (``"by"`` names it).
        shards: The logical shards followed (those that read the document).
        checked: How steps before the checkpoint were checked, or None.
        not_followed: Token stages the trace could not follow.
    """

    dataset: str
    file: str
    doc: int
    until: int
    seen: list[dict[str, Any]]
    passed_over: list[dict[str, Any]]
    dropped: list[dict[str, Any]]
    shards: list[int]
    checked: str | None
    not_followed: list[str]

    def to_plain(self) -> dict[str, Any]:
        """``{"document": {...}, "until": N, "seen": [{"step", "rank", "row", "start",
        "length", ...}], ...}``: what ``fmsdata trace --doc --json`` prints."""
        out: dict[str, Any] = {
            "document": {"dataset": self.dataset, "file": self.file, "doc": self.doc},
            "until": self.until,
            "seen": self.seen,
            "passed_over": self.passed_over,
            "dropped": self.dropped,
            "shards": self.shards,
            "exact": not self.not_followed,
        }
        if self.checked:
            out["checked"] = self.checked
        if self.not_followed:
            out["not_followed"] = self.not_followed
        return out


def find_document(origin: Origin, dataset: str, file: str | int, doc: int) -> tuple[int, int]:
    """The dataset index (in the spans' numbering of ``origin``) and file index of a
    document named by dataset name, file (path relative to the root or to the dataset's
    folder, or its index in the dataset's sorted file list) and document index.

    Raises:
        ConfigError: No such dataset, file or document (naming what there is).
    """
    datasets = origin.dataset.catalog().datasets
    names = [d.name for d in datasets]
    if dataset not in names:
        raise ConfigError(f"--doc: no dataset {dataset!r}; the run's datasets are {names}")
    ds = names.index(dataset)
    paths = list(datasets[ds].paths)
    if isinstance(file, int) or str(file).isdigit():
        index = int(file)
        if not 0 <= index < len(paths):
            raise ConfigError(f"--doc: dataset {dataset!r} has {len(paths)} files, no file {index}")
        return ds, index
    relative = str(file).strip("/")
    for candidate in (relative, f"{dataset}/{relative}"):
        if candidate in paths:
            return ds, paths.index(candidate)
    shown = ", ".join(paths[:3]) + (" ..." if len(paths) > 3 else "")
    raise ConfigError(f"--doc: dataset {dataset!r} has no file {file!r} (its files: {shown})")


def reading_shards(origin: Origin, ds: int, file: int, doc: int) -> list[int]:
    """The logical shards whose chain may read the document: those whose stream of its
    dataset ``reads`` it; every shard whose chain has no stream of the dataset that says
    (a document source of your own)."""
    dataset = origin.dataset
    context = dataset.shard_context(1)
    name = context.accesses[ds].name
    try:
        count = context.accesses[ds].doc_count(file)
        if not 0 <= doc < count:
            raise ConfigError(
                f"--doc: {context.accesses[ds].path(file)} holds {count} documents, no {doc}"
            )
        shards = []
        for shard in range(origin.config.logical_shards):
            pipeline = build_pipeline(shard, context.recipe, context.accesses, dataset.stages)
            streams = [
                stage
                for _, stage in walk(pipeline.top)
                if stage.role == "dataset"
                and stage.settings().get("dataset") == name
                and callable(getattr(stage, "reads", None))
            ]
            if not streams or any(s.reads(file, doc) for s in streams):  # type: ignore[attr-defined]
                shards.append(shard)
        return shards
    finally:
        context.close()


class ToldRun(Protocol):
    """What a document's trace asks of the run it is told in (a ``Tracer``)."""

    @property
    def checkpoint_step(self) -> int | None: ...

    def origin(self, which: str) -> Origin: ...

    def check_reaches(self, walker: StepWalker) -> None: ...

    def check_known(self, step: int) -> None: ...


def trace_document(
    tracer: ToldRun, dataset: str, file: str | int, doc: int, until: int | None = None
) -> DocumentTrace:
    """Every step up to ``until`` (default: the checkpoint's step) at which the
    document's tokens were delivered, with rank, row and the pieces' token ranges.

    Raises:
        ConfigError: No such document, no ``until`` without a checkpoint, or an
            ``until`` past what the checkpoint knows of a mix that follows the loss
            (``Tracer.check_known``).
        StateMismatchError: Steps before the checkpoint that it cannot tell.
    """
    last = tracer.checkpoint_step
    if until is None:
        if last is None:
            raise ConfigError(
                "--doc needs --until N (the last step to look at) without a checkpoint"
            )
        until = last
    if until < 1:
        raise ConfigError(f"--until counts steps from 1, got {until}")
    found = DocumentTrace(dataset, "", doc, until, [], [], [], [], None, [])
    parts = [("before", min(until, last))] if last is not None else []
    if last is None or until > last:
        tracer.check_known(until)
        parts.append(("after", until))
    for which, end in parts:
        origin = tracer.origin(which)
        if dataset not in [d.name for d in origin.dataset.catalog().datasets]:
            continue  # not in the mix on this side of the checkpoint: never delivered here
        ds, f = find_document(origin, dataset, file, doc)
        found.file = str(origin.dataset.catalog().datasets[ds].paths[f])
        shards = reading_shards(origin, ds, f, doc)
        found.shards.extend(shards)
        with StepWalker(origin, follow=shards) as walker:
            _scan(walker, end, (ds, f, doc), found)
            if which == "before":
                tracer.check_reaches(walker)
                found.checked = (
                    f"steps up to {end} replayed from {origin.label}; the replay reaches the "
                    f"checkpoint's state (step {last}) in the shards followed"
                )
    if not found.file:  # the message names the datasets there are
        find_document(tracer.origin("after"), dataset, file, doc)
    for entries in (found.seen, found.passed_over, found.dropped):
        entries.sort(key=operator.itemgetter("step", "rank", "row", "start"))
    found.shards = sorted(set(found.shards))
    found.not_followed = sorted(set(found.not_followed))
    return found


def _scan(walker: StepWalker, until: int, key: tuple[int, int, int], found: DocumentTrace) -> None:
    """Walk to ``until``, pulling the followed shards' lines and telling each that holds
    the document ``key`` (dataset, file, doc in the walk's numbering)."""
    # Per followed shard, (step, rank, row, skip) of each line dealt and not pulled yet.
    slots: dict[int, list[tuple[int, int, int, Any]]] = {s: [] for s in walker.follow}
    while walker.steps < until:
        if walker.change_due(walker.steps):  # the run's weights changed here
            _pull(walker, slots, key, found)
            walker.apply_changes(walker.steps)
        deal = walker.next_deal()
        for rank, shards in enumerate(deal.shards):
            for row, shard in enumerate(shards or ()):
                if shard in slots:
                    slots[shard].append((deal.step, rank, row, deal.skipped))
        if sum(map(len, slots.values())) >= _FLUSH_LINES:
            _pull(walker, slots, key, found)
    _pull(walker, slots, key, found)


def _pull(
    walker: StepWalker,
    slots: dict[int, list[tuple[int, int, int, Any]]],
    key: tuple[int, int, int],
    found: DocumentTrace,
) -> None:
    tracer = line_tracer(walker)
    for shard, dealt in slots.items():
        if not dealt:
            continue
        first = walker.next_line(shard)
        block = walker.take(shard, len(dealt))
        spans = block.spans
        hit = (spans[:, 0] == key[0]) & (spans[:, 1] == key[1]) & (spans[:, 2] == key[2])
        if hit.any():
            lines = np.repeat(np.arange(len(block)), block.counts)[hit]
            for k in np.unique(lines).tolist():
                step, rank, row, skipped = dealt[k]
                traced = walker.told(tracer, block.line(k), rank, row, shard, first + k)
                _record(traced, step, skipped, key, found)
        dealt.clear()


def _record(
    row: RowTrace, step: int, skipped: Any, key: tuple[int, int, int], found: DocumentTrace
) -> None:
    """File the pieces of the document in a told row."""
    found.not_followed.extend(row.not_followed)
    where: dict[str, Any] = {"step": step, "rank": row.rank, "row": row.row}
    into = found.passed_over if skipped is not None else found.seen
    for at, part in row.placed():
        if part.is_doc and (part.dataset, part.file, part.doc) == key:
            entry = {**where, "start": part.start, "length": part.length, "at": at}
            if part.role:
                entry["role"] = part.role
            into.append(entry)
    for parts, _, stage in row.dropped:
        for part in parts:
            if part.is_doc and (part.dataset, part.file, part.doc) == key:
                found.dropped.append(
                    {**where, "start": part.start, "length": part.length, "by": stage}
                )
