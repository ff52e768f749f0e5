"""A one-at-a-time model of best-fit-decreasing packing over windows (``packing: best_fit``),
written from the rule in ``fmsdata.stages.bestfitplan``'s docstring with Python lists, to
check the compiled plan and the packer against."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Piece = tuple[Any, int, int]  # (document, start, length)


def best_fit_windows(
    docs: Sequence[tuple[Any, int]],
    window: int,
    capacity: int,
    open_lines: Sequence[Sequence[Piece]] = (),
) -> list[dict[str, Any]]:
    """Per whole window of ``docs`` (``(document, length)`` in source order): the lines
    emitted (``"lines"``, each a list of pieces), the lines left open (``"open"``), the
    documents cut and the padding of the emitted lines. ``open_lines``: the lines open
    before the first window."""
    carried = [list(line) for line in open_lines]
    out = []
    for w in range(len(docs) // window):
        chunk = docs[w * window : (w + 1) * window]
        lines = []
        order = 0  # a piece's place in source order: carried pieces first
        for i, line in enumerate(carried):
            pieces = []
            for piece in line:
                pieces.append((order, piece))
                order += 1
            lines.append(
                {
                    "pieces": pieces,
                    "room": capacity - sum(piece[2] for piece in line),
                    "key": i - len(carried),  # before every document of the window
                    "carried": True,
                }
            )
        items, cut = [], 0
        for p, (name, length) in enumerate(chunk):
            start = 0
            if length > capacity:
                cut += 1
            while length > capacity:  # a full piece is a line of its own
                lines.append(
                    {
                        "pieces": [(order + p, (name, start, capacity))],
                        "room": 0,
                        "key": p,
                        "carried": False,
                    }
                )
                start += capacity
                length -= capacity
            if length > 0:
                items.append((length, p, name, start))
        items.sort(key=lambda item: (-item[0], item[1]))  # longest first, then earliest
        for length, p, name, start in items:
            best = None
            for i, line in enumerate(lines):  # least room that holds it, earliest line
                if line["room"] >= length and (best is None or line["room"] < lines[best]["room"]):
                    best = i
            if best is None:
                lines.append({"pieces": [], "room": capacity, "key": p, "carried": False})
                best = len(lines) - 1
            line = lines[best]
            line["room"] -= length
            line["key"] = min(line["key"], p)
            line["pieces"].append((order + p, (name, start, length)))
        ranked = sorted(range(len(lines)), key=lambda i: (lines[i]["key"], i))
        emitted = [i for i in ranked if lines[i]["carried"] or lines[i]["room"] == 0]
        staying = [i for i in ranked if not (lines[i]["carried"] or lines[i]["room"] == 0)]

        def pieces_of(i: int, lines: list[dict[str, Any]] = lines) -> list[Piece]:
            return [piece for _, piece in sorted(lines[i]["pieces"])]

        out.append(
            {
                "lines": [pieces_of(i) for i in emitted],
                "open": [pieces_of(i) for i in staying],
                "cut": cut,
                "padding": sum(lines[i]["room"] for i in emitted),
            }
        )
        carried = [pieces_of(i) for i in staying]
    return out
