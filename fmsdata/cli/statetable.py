"""The tables ``fmsdata state show`` prints: per dataset, and per logical shard.

Each column says what it counts and in which unit, under a group label when several count
the same thing (``delivered``: ``docs``, ``tokens``); numbers are right-aligned with
thousands separators, names left-aligned, and a column is as wide as its longest entry.
Columns of what only some chains hold (lines held by stages of your own, pieces dropped by
filters, documents under ``min_length``) are shown when some dataset has any, and named as
none otherwise. ``--json`` prints the same figures under the keys it always had.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Column", "render", "dataset_table", "shard_table"]

_GAP = "  "


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: a group label above (shared by neighbours with the same one), its own
    label, how a row's value is written, and whether it is a number (right-aligned)."""

    group: str
    label: str
    value: Callable[[Any], str]
    number: bool = True


def render(columns: Sequence[Column], rows: Sequence[Any]) -> list[str]:
    """The lines of a table: a row of group labels (when any column has one), a row of
    column labels, then one line per row."""
    cells = [[column.value(row) for column in columns] for row in rows]
    widths = [
        max([len(column.label), *(len(line[i]) for line in cells)])
        for i, column in enumerate(columns)
    ]
    groups = _groups(columns)
    for first, last, label in groups:  # a group label wider than its columns widens them
        span = sum(widths[first : last + 1]) + len(_GAP) * (last - first)
        for k in range(max(0, len(label) - span)):
            widths[first + k % (last - first + 1)] += 1
    lines = []
    if any(label for _, _, label in groups):
        tops = []
        for first, last, label in groups:
            span = sum(widths[first : last + 1]) + len(_GAP) * (last - first)
            tops.append(label.center(span) if label else " " * span)
        lines.append(_GAP.join(tops).rstrip())
    lines.append(_line([c.label for c in columns], columns, widths))
    lines.extend(_line(line, columns, widths) for line in cells)
    return lines


def _groups(columns: Sequence[Column]) -> list[tuple[int, int, str]]:
    """(first, last, label) of each run of neighbouring columns with one group label."""
    runs: list[tuple[int, int, str]] = []
    for i, column in enumerate(columns):
        if runs and column.group and runs[-1][2] == column.group:
            runs[-1] = (runs[-1][0], i, column.group)
        else:
            runs.append((i, i, column.group))
    return runs


def _line(texts: Sequence[str], columns: Sequence[Column], widths: Sequence[int]) -> str:
    return _GAP.join(
        text.rjust(width) if column.number else text.ljust(width)
        for text, column, width in zip(texts, columns, widths)
    ).rstrip()


def _count(key: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda row: f"{row[key]:,}"


# Columns of what only some chains hold: (group, [(label, key)], what it is, in words).
_OPTIONAL = (
    ("held by stages", [("tokens", "held_tokens")], "lines held by stages of your own"),
    (
        "dropped by filters",
        [("docs", "dropped_docs"), ("tokens", "dropped_tokens")],
        "pieces dropped by a filter or transform",
    ),
    ("too short", [("docs", "skipped_docs")], "documents under min_length"),
)


def dataset_table(datasets: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The per-dataset table of ``summarize``'s ``datasets``, then a legend."""
    rows = [{"name": name, **totals} for name, totals in datasets.items()]
    columns = [
        Column("", "dataset", lambda row: str(row["name"]), number=False),
        Column("delivered", "docs", _count("docs")),
        Column("delivered", "tokens", _count("tokens")),
        Column("in shuffle buffer", "docs", _count("buffered_docs")),
        Column("in shuffle buffer", "tokens", _count("buffered_tokens")),
        Column("unsent", "tokens", _count("unsent_tokens")),
    ]
    none = []
    for group, fields, words in _OPTIONAL:
        if any(row[key] for row in rows for _, key in fields):
            columns += [Column(group, label, _count(key)) for label, key in fields]
        else:
            none.append(words)
    columns.append(Column("epochs", "done", lambda row: _fraction(row["epochs_done"])))
    legend = [
        "delivered: in lines handed out to training (a document once no stage holds a piece of it)",
        "in shuffle buffer: in lines the shuffle buffer still holds",
        "unsent: in the packer, not handed out yet (the rest of a document split across lines; "
        "with best_fit packing, its ready and open lines)",
    ]
    shown = {column.group for column in columns}
    legend += [f"{group}: {words}" for group, _, words in _OPTIONAL if group in shown]
    legend.append("epochs done: passes over the dataset's documents, all logical shards")
    if none:
        legend.append("none in this state (no column): " + "; ".join(none))
    return render(columns, rows) + ["", *legend]


def shard_table(shards: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-logical-shard table of ``summarize``'s ``shards``: one line per shard and
    dataset, and under a shard the lines it emitted after its recorded position."""
    columns = [
        Column("", "shard", lambda row: str(row["id"]) if row["first"] else ""),
        Column("", "dataset", lambda row: str(row["name"]), number=False),
        Column("", "epoch", lambda row: str(row["epoch"])),
        Column("this epoch", "docs read", _position),
        Column("delivered", "docs", _count("docs")),
        Column("delivered", "tokens", _count("tokens")),
        Column("in shuffle buffer", "tokens", _count("buffered_tokens")),
    ]
    rows = []
    after: dict[int, int] = {}
    for shard in shards:
        for i, (name, info) in enumerate(shard["datasets"].items()):
            rows.append({"id": shard["id"], "first": i == 0, "name": name, **info})
        if shard["advance"]:
            after[len(rows) - 1] = shard["advance"]
    lines = render(columns, rows)
    head = len(lines) - len(rows)
    out = lines[:head]
    for i, line in enumerate(lines[head:]):
        out.append(line)
        if i in after:
            out.append(
                f"{'':5}+{after[i]:,} line(s) emitted after this recorded position, not in "
                "these counts"
            )
    return out


def _position(row: Mapping[str, Any]) -> str:
    """Documents of the shard's portion walked this epoch, of how many."""
    if row["size"] < 0:
        return "not started"
    return f"{row['pos']:,} of {row['size']:,}"


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
