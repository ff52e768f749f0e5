"""What a saved loader state says was delivered, asked of each stage (``Stage.report``).

Nothing here reads a stage's keys. The fingerprint records the chain (each stage's path in
the shard state, its type and role); each stage's own part of a shard state goes to that
stage type's ``report``, which says what it holds (spans taken from its input and not
handed out), what it counts, and, for a document source, what it took per dataset (the
mixer its tokens, each dataset's stream its documents and position). So,
per dataset and exactly, for any chain::

    delivered = taken - held - dropped

``held`` is what every stage holds (the shuffle buffer's lines, the packer's unsent carry,
a user stage's held lines), and a document counts as delivered once no stage holds a piece
of it. ``dropped`` is what token stages took out of the lines (a ``DocumentFilter``'s
dropped pieces, per dataset index: ``dropped_tokens``, ``dropped_docs`` for damaged
documents whose pieces all passed it, ``dropped_open`` for damaged documents split over
lines whose other pieces it has not seen: those count as dropped unless a stage holds a
piece of them, then as held). Lines a shard emitted after its recorded state (``advance``:
a worker item in flight) are not in its state: they are counted only once replayed
(``state show --config``), and left out, and said to be, otherwise.

The chain is walked as the fingerprint records it (``fmsdata.stages.savedchain``): a stage type
is looked up among the ``Stage`` classes this process has imported; a dataset's stream
of a class not imported here (a user's document order) is read by ``DocumentStream``,
which owns every stream's state; a stage of another unknown type is named in ``unknown``
and what it holds is not subtracted.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fmsdata.stages.base import Stage
from fmsdata.stages.savedchain import saved_stages
from fmsdata.stages.spans import LENGTH, SAVED_SPAN_WIDTH, START

__all__ = ["DELIVERY_KEYS", "ShardReport", "shard_report"]

# Per dataset: taken (by the document source), held (by the stages after it, by kind),
# dropped (by token stages), delivered = taken - buffered - unsent - held - dropped; each in
# tokens and in documents ("taken_tokens", "taken_docs", "buffered_tokens", ...).
_HELD_AS = ("buffered", "unsent", "held")
_TAKEN_OUT = (*_HELD_AS, "dropped")
_UNITS = ("tokens", "docs")
DELIVERY_KEYS = tuple(f"{k}_{u}" for k in ("taken", *_TAKEN_OUT, "delivered") for u in _UNITS)
# What a dataset's stream reports besides (as the document source reports them).
_STREAM_KEYS = {"epoch": 0, "pos": 0, "size": -1, "skipped": 0}


class ShardReport:
    """One logical shard's state as its stages report it.

    Attributes:
        datasets: Per dataset name, ``DELIVERY_KEYS`` counts plus the stream's ``epoch``,
            ``pos``, ``size`` and ``skipped`` (as the document source reports them).
        counts: Per stage name (``Type at path``), the counts it reports.
        ratios: Per stage name, the ratios of its counts it asks to be shown: ``{name:
            (numerator, denominator)}``, names of its counts.
        unknown: Stages of a type this process has not imported (not subtracted).
    """

    def __init__(self, names: Sequence[str]):
        self.datasets: dict[str, dict[str, int]] = {
            name: {**dict.fromkeys(DELIVERY_KEYS, 0), **_STREAM_KEYS} for name in names
        }
        self.counts: dict[str, dict[str, int]] = {}
        self.ratios: dict[str, dict[str, tuple[str, str]]] = {}
        self.unknown: list[str] = []


def shard_report(
    shard_state: Any,
    fingerprint: Mapping[str, Any],
    span_datasets: Sequence[str],
    types: Mapping[str, type[Stage]] | None = None,
) -> ShardReport:
    """What a logical shard's state (None: not started) says, per dataset of the mix and
    per stage (see the module docstring). ``types``: the stage classes to ask (default:
    ``stage_types()``)."""
    out = ShardReport(list(fingerprint["datasets"]))
    if shard_state is None:
        return out
    held: list[tuple[str, np.ndarray, Any]] = []  # (held_as, spans, tokens per dataset index)
    damaged: list[tuple[int, int, int]] = []  # split documents a token stage dropped a piece of
    for stage in saved_stages(fingerprint.get("stages") or [], shard_state["stages"], "", types):
        if stage.cls is None:
            out.unknown.append(stage.label)
            continue
        report = stage.cls.report(stage.own)
        record = stage.record
        per_dataset = dict(report.get("datasets") or {})
        if report.get("dataset"):  # one dataset's stream: its settings name the dataset
            per_dataset[str((record.get("settings") or {}).get("dataset"))] = report["dataset"]
        for name, taken in per_dataset.items():
            if name in out.datasets:
                out.datasets[name].update({k: int(v) for k, v in taken.items()})
        if report.get("counts"):
            out.counts[stage.label] = {str(k): int(v) for k, v in report["counts"].items()}
        if report.get("ratios"):
            out.ratios[stage.label] = {
                str(k): (str(top), str(bottom)) for k, (top, bottom) in report["ratios"].items()
            }
        for unit in _UNITS:
            for ds, n in enumerate(report.get(f"dropped_{unit}") or ()):
                name = span_datasets[ds] if ds < len(span_datasets) else None
                if name in out.datasets:
                    out.datasets[name][f"dropped_{unit}"] += int(n)
        damaged.extend((int(ds), int(f), int(d)) for ds, f, d in report.get("dropped_open") or ())
        spans = np.asarray(report.get("held", ()), dtype=np.int64).reshape(-1, SAVED_SPAN_WIDTH)
        if len(spans):
            as_ = report.get("held_as", "held")
            held.append((as_ if as_ in _HELD_AS else "held", spans, report.get("held_tokens")))
    _subtract_held(out.datasets, held, damaged, span_datasets)
    return out


def _subtract_held(
    datasets: dict[str, dict[str, int]],
    held: Sequence[tuple[str, np.ndarray, Any]],
    damaged: Sequence[tuple[int, int, int]],
    span_datasets: Sequence[str],
) -> None:
    """Count what the stages hold and set ``delivered = taken - held - dropped``. A
    document is delivered once no stage holds a piece of it and no token stage dropped
    one; one held twice (from two epochs) shows as a start held twice; a document with an
    unsent piece counts as unsent; a damaged split document that no stage holds a piece
    of counts as dropped."""
    for as_, spans, tokens in held:
        if tokens is None:
            tokens = np.bincount(spans[:, 0], weights=spans[:, LENGTH], minlength=1).tolist()
        for ds, n in enumerate(tokens):
            name = span_datasets[ds] if ds < len(span_datasets) else None
            if name in datasets:
                datasets[name][f"{as_}_tokens"] += int(n)
    pieces: dict[tuple[int, int, int], list[tuple[str, int]]] = {}
    for as_, spans, _ in held:
        for row in spans.tolist():
            pieces.setdefault((row[0], row[1], row[2]), []).append((as_, row[START]))
    for (ds, _, _), where in pieces.items():
        name = span_datasets[ds] if ds < len(span_datasets) else None
        if name not in datasets:
            continue
        times = max(collections.Counter(start for _, start in where).values())
        kinds = {as_ for as_, _ in where}
        first = next(k for k in ("unsent", "buffered", "held") if k in kinds)
        datasets[name][f"{first}_docs"] += 1
        if times > 1:  # the same document held from two epochs: the other pieces' kind
            other = "buffered" if "buffered" in kinds else first
            datasets[name][f"{other}_docs"] += times - 1
    for ds, file, doc in set(damaged):
        name = span_datasets[ds] if ds < len(span_datasets) else None
        if name in datasets and (ds, file, doc) not in pieces:
            datasets[name]["dropped_docs"] += 1
    for entry in datasets.values():
        for unit in _UNITS:
            entry[f"delivered_{unit}"] = entry[f"taken_{unit}"] - sum(
                entry[f"{as_}_{unit}"] for as_ in _TAKEN_OUT
            )
