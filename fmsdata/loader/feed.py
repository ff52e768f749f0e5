"""The workers' items and their batches, as the loader's iteration asks for them.

``Feed`` receives the next item of each worker and assembles a batch of them when asked
(``fmsdata.transport.assemble``); ``AheadFeed`` assembles them on a side thread, a few
ahead, for pinned batches. ``RUNNING`` keeps each running iteration's DataLoader iterator
until the iteration has ended (see its comment).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from fmsdata.transport.batchring import BatchRing
from fmsdata.transport.items import WorkerError, WorkerItem
from fmsdata.util.threads import AheadThread

__all__ = ["Feed", "AheadFeed", "PIN_AHEAD", "RUNNING"]

# Batches the pinning thread may assemble ahead of the training loop.
PIN_AHEAD = 2


# The DataLoader iterator of each running iteration, held here until the iteration ends
# and has stopped its workers (``_end_workers``). An iteration freed by the cyclic
# garbage collector (its loader or generator held by a reference cycle: any traceback
# kept that holds their frames) is otherwise collected together with its DataLoader
# iterator, and CPython runs the weakref callbacks of garbage before any ``__del__``:
# multiprocessing's finalizer of each worker's index queue then tells the queue's feeder
# thread to quit, and the stop message torch's ``__del__`` puts in the queue next is never
# sent. Each worker waited for it until torch's join timed out (5 s), then was terminated.
# Held from here, the queues are not garbage while the iteration's ``finally`` runs.
RUNNING: dict[int, Any] = {}


class Feed:
    """The workers' items and their batches, assembled when asked for, in order; the
    ring's bookkeeping (``fmsdata.transport.batchring``) is done here, on the thread that
    assembles."""

    def __init__(
        self,
        parts: Iterator[WorkerItem],
        ring: BatchRing | None,
        n_parts: int,
        assemble: Callable[[list[WorkerItem], BatchRing | None, int], Any],
    ):
        self.parts, self.ring, self.n_parts, self.assemble = parts, ring, n_parts, assemble
        self._current: list[WorkerItem] | None = None
        self._upto = 0  # the next batch of the current items to assemble
        self._received: int | None = None  # end of the batch numbers of items received
        if ring is not None:
            ring.in_use = True

    def items(self) -> tuple[list[WorkerItem], int]:
        """The next items (one per worker) and how many batches they hold. A worker's
        fmsdata error comes as an item (``WorkerError``) and is raised here, as it was made."""
        self._pass_over(None)
        if self.ring is not None:
            self.ring.collect()  # slots freed since: the workers may write them again
        items = []
        for _ in range(self.n_parts):
            item = next(self.parts)
            if isinstance(item, WorkerError):
                item.reraise()
            items.append(item)
        n_batches = len(items[0].offsets) - 1
        self._current, self._upto = items, 0
        self._received = items[0].first + n_batches
        return items, n_batches

    def batch(self, k: int) -> dict[str, torch.Tensor]:
        """Batch ``k`` of the current items (those before it not asked for are passed over)."""
        assert self._current is not None, "items() comes first"
        if self.ring is not None:
            self.ring.collect()
        if k > self._upto:
            self._pass_over(k)
        self._upto = k + 1
        return self.assemble(self._current, self.ring, k)

    def _pass_over(self, until: int | None) -> None:
        """Batches of the current items before ``until`` (None: all) not assembled: their
        ring slots are free again."""
        items = self._current
        if items is None or self.ring is None or items[0].samples is not None:
            return
        end = len(items[0].offsets) - 1 if until is None else until
        for k in range(self._upto, end):
            self.ring.pass_over(items[0].first + k)
        self._upto = max(self._upto, end)

    def close(self) -> None:
        """Stop using the ring: the next workers number their batches past all of these."""
        self._current = None
        if self.ring is not None:
            if self._received is not None:
                self.ring.restart(self._received)
                self._received = None
            self.ring.in_use = False


class AheadFeed(Feed):
    """A feed whose batches are all assembled in order on a side thread (``AheadThread``),
    at most ``depth`` ahead; batches passed over by a skip are dropped unread."""

    def __init__(self, feed: Feed, depth: int):
        self._feed = feed
        self._thread = AheadThread(self._stream(feed), depth)
        self._next: tuple[list[WorkerItem], int, int, Any] | None = None
        self._items: list[WorkerItem] | None = None

    @staticmethod
    def _stream(feed: Feed) -> Iterator[tuple[list[WorkerItem], int, int, Any]]:
        while True:
            items, n_batches = feed.items()
            for k in range(n_batches):
                yield items, n_batches, k, feed.batch(k)

    def _pop(self) -> tuple[list[WorkerItem], int, int, Any]:
        entry, self._next = self._next, None
        return entry if entry is not None else next(self._thread)

    def items(self) -> tuple[list[WorkerItem], int]:
        while True:
            entry = self._pop()
            if entry[0] is not self._items:  # the rest of the current items was passed over
                self._next, self._items = entry, entry[0]
                return entry[0], entry[1]

    def batch(self, k: int) -> dict[str, torch.Tensor]:
        while True:
            items, _, at, batch = self._pop()
            if items is self._items and at == k:
                return batch

    def close(self) -> None:
        self._next = self._items = None
        self._thread.close()
        self._feed.close()  # the thread is gone: the ring's bookkeeping is ours
