"""Shared memory where DataLoader workers leave the spans their shuffle journals push.

A worker's round-end item carries the spans of every line the round pushed into a shuffle
buffer (``WorkerItem.pushed``); the main process keeps them until no buffer holds any of
those lines (``fmsdata.bufferreplica``), to write a state from. Sent through the
DataLoader's pipe, those bytes were most of the main process's cost on short documents:
with the spans left out of the items, its CPU a batch fell from 29 to 12 µs with eight
workers and from 21 to 15 µs with one (60-token documents, 2-core box), most of the
difference the kernel zeroing fresh pages for bytes then copied out of the pickle.

Here a worker copies its packed spans (``fmsdata.narrowrows.NarrowRows``) into blocks of
an arena the main process made before starting it (shared memory, every page touched
once, reused for as long as the loader lives) and the item carries only their place. The
main process reads them where they lie and gives the blocks back when the last reference
to them goes.

Ownership of a block passes through ``used`` (shared, a byte a block): a worker takes
only blocks at 0, setting them to 1 before it writes them, and the main process sets them
back to 0 when the ``ArenaBlob`` it received there is freed. Blocks taken for items the
main process never received (workers stopped with items in flight) are given back before
the next workers start (``reclaim``). A worker that finds no run of free blocks long
enough sends the spans in its item, as every worker did before.
"""

from __future__ import annotations

import os
import uuid
import weakref
from typing import Any

import numpy as np
import torch

from fmsdata.batchring import move_to_shared_memory

__all__ = ["JournalArena", "ArenaBlob", "ARENA_BYTES"]

# Bytes a block; an arena's bytes per rank, split between its workers. On 60-token
# documents one worker's blobs took 34 MiB of it, eight workers' 30 MiB (a round's spans
# are kept until the last of its lines leaves the buffers: many rounds on small documents).
BLOCK = 1 << 16
ARENA_BYTES = 64 << 20

# The arenas this process made, by key: where a received ``ArenaBlob`` finds its memory.
_OPEN: weakref.WeakValueDictionary[str, JournalArena] = weakref.WeakValueDictionary()


class JournalArena:
    """``workers`` regions of shared memory, one per DataLoader worker, in blocks.

    Args:
        workers: DataLoader workers (one region each).
        nbytes: Bytes of all regions together (default ``ARENA_BYTES``).

    Raises:
        ConfigError: The shared-memory filesystem cannot hold the arena.
    """

    def __init__(self, workers: int, nbytes: int | None = None):
        blocks = max(1, (nbytes or ARENA_BYTES) // workers // BLOCK)
        self.key = uuid.uuid4().hex
        self.data = torch.zeros((workers, blocks * BLOCK), dtype=torch.uint8)
        self.used = torch.zeros((workers, blocks), dtype=torch.int8)
        # Copies the zeros: every page is there from now on.
        move_to_shared_memory([self.data, self.used], self._too_big)
        self.in_use = False  # workers of a running iteration write it
        # Main process only (its pid: a forked worker inherits this object, and the
        # received blobs, which it must neither free nor receive): blocks whose blob it
        # received and still holds.
        self._pid = os.getpid()
        self._held: np.ndarray | None = np.zeros((workers, blocks), dtype=bool)
        self._setup()
        _OPEN[self.key] = self

    def _too_big(self, need: int, found: str) -> str:
        return (
            f"the DataLoader workers' journal arena needs {need / 2**20:.0f} MiB of shared "
            f"memory (the shuffle buffers' spans on their way to the main process) and "
            f"{found}: give the process more shared memory (docker run --shm-size=..., or "
            f"--ipc=host)"
        )

    def _setup(self) -> None:
        self._data = self.data.numpy()
        self._used = self.used.numpy()

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "data": self.data, "used": self.used}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.in_use = False
        self._held = None
        self._setup()

    # -- a worker's side -----------------------------------------------------------------

    def store(self, worker: int, blob: np.ndarray) -> ArenaBlob | None:
        """``blob`` (a contiguous array) copied into the first run of free blocks of
        ``worker``'s region, or None where there is none long enough (or it is empty)."""
        n = -(-blob.nbytes // BLOCK)
        used = self._used[worker]
        if n == 0 or n > len(used):
            return None
        free = np.zeros(len(used) + 1, dtype=np.int64)
        np.cumsum(used == 0, out=free[1:])
        fits = np.flatnonzero(free[n:] - free[:-n] == n)
        if not len(fits):
            return None
        first = int(fits[0])
        used[first : first + n] = 1  # taken before written
        start = first * BLOCK
        self._data[worker, start : start + blob.nbytes] = blob.reshape(-1).view(np.uint8)
        return ArenaBlob(self, worker, first, n, blob.nbytes, owned=False)

    # -- the main process's side ---------------------------------------------------------

    def _made_here(self) -> bool:
        return self._held is not None and self._pid == os.getpid()

    def _receive(self, worker: int, first: int, blocks: int, nbytes: int) -> ArenaBlob:
        held = self._held
        if not self._made_here() or held is None or held[worker, first : first + blocks].any():
            raise RuntimeError(
                f"journal arena {self.key}: blocks {first}-{first + blocks - 1} of worker "
                f"{worker} received outside the process that made it, or twice"
            )
        held[worker, first : first + blocks] = True
        return ArenaBlob(self, worker, first, blocks, nbytes, owned=True)

    def _release(self, worker: int, first: int, blocks: int) -> None:
        if not self._made_here():  # a forked worker dropping what it inherited
            return
        assert self._held is not None
        self._held[worker, first : first + blocks] = False
        self._used[worker, first : first + blocks] = 0

    def reclaim(self) -> None:
        """Free every block the main process does not hold: the blocks of items sent by
        workers that stopped before the main process received them. Only while no worker
        runs."""
        assert self._held is not None
        self._used[...] = self._held

    def taken_blocks(self) -> int:
        """Blocks taken by workers and not freed since, in all regions."""
        return int(np.count_nonzero(self._used))


class ArenaBlob:
    """Bytes a worker left in an arena: pickled as their place; where the main process
    unpickles it, its blocks are free again once the blob is freed."""

    __slots__ = ("arena", "worker", "first", "blocks", "nbytes", "_owned")

    def __init__(
        self, arena: JournalArena, worker: int, first: int, blocks: int, nbytes: int, owned: bool
    ):
        self.arena, self.worker, self.first = arena, worker, first
        self.blocks, self.nbytes, self._owned = blocks, nbytes, owned

    @property
    def array(self) -> np.ndarray:
        """The bytes, where they lie (uint8; read them while the blob lives)."""
        start = self.first * BLOCK
        return self.arena._data[self.worker, start : start + self.nbytes]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._owned:  # received already (a copy of an item): the bytes, not the place
            return np.array, (self.array,)
        return _received, (self.arena.key, self.worker, self.first, self.blocks, self.nbytes)

    def __del__(self) -> None:
        if self._owned:
            self._owned = False
            self.arena._release(self.worker, self.first, self.blocks)


def _received(key: str, worker: int, first: int, blocks: int, nbytes: int) -> ArenaBlob:
    arena = _OPEN.get(key)
    if arena is None:
        raise RuntimeError(f"journal arena {key} was not made in this process")
    return arena._receive(worker, first, blocks, nbytes)
