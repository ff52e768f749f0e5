"""Parts of a state made only when the state is read.

A worker takes the state of every shard a round advanced at the round's end, but the main
process reads one only to save a state or to start workers again. A shuffle buffer's
state is its whole window of lines: packing it into the saved form every round cost more
than the round's own lines on 60-token documents (the window is five times the lines a
round moves). So the state taken at a round's end may hold a ``Deferred`` part (the
buffer's rows as they stand, shared, and its slots) that is made into plain data when
the state is read (``made``) or when it is pickled to travel from a worker.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Deferred", "made"]


class Deferred:
    """A part of a state that is made when read (``make``); it pickles as what it makes,
    so a state that travels from a worker arrives as plain data."""

    __slots__ = ()

    def make(self) -> Any:
        raise NotImplementedError

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _as_made, (self.make(),)


def _as_made(value: Any) -> Any:
    return value


def made(state: Any) -> Any:
    """``state`` with every ``Deferred`` in it made, in place (dicts and lists are walked;
    a state taken at a round's end belongs to the one who took it)."""
    if isinstance(state, Deferred):
        return state.make()
    if isinstance(state, dict):
        for key, value in state.items():
            if isinstance(value, (Deferred, dict, list)):
                state[key] = made(value)
    elif isinstance(state, list):
        for i, value in enumerate(state):
            if isinstance(value, (Deferred, dict, list)):
                state[i] = made(value)
    return state
