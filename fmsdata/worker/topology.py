"""Who owns what: logical shards per rank, per worker, and batch rows per shard.

A rank owns a contiguous run of logical shards, as even as ``L`` and ``W`` allow; its
DataLoader workers split those shards in runs of ``batch_size`` consecutive shards when the
runs divide evenly among them (then each batch of a level deal is made by one worker, and
the main process copies it in one piece), else round-robin. Which worker makes a line never
changes the line. Rows of each batch are dealt to the
rank's shards by a fixed rule — the shard that has emitted the fewest lines, lowest id
first — which is plain round-robin whenever the shards are level, and levels them again
after a rescale. Every worker evaluates the rule for all the rank's shards, so batches are
assembled in the same canonical order whatever the number of workers.
"""

from __future__ import annotations

import dataclasses
import heapq
import os

from fmsdata.errors import ConfigError

__all__ = ["Topology", "owned_shards", "worker_shards", "RowDealer"]


@dataclasses.dataclass(frozen=True)
class Topology:
    """Rank and world size of this process (frozen: nothing changes them later)."""

    rank: int
    world_size: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is not valid for world_size {self.world_size}")

    @staticmethod
    def resolve(rank: int | None = None, world_size: int | None = None) -> Topology:
        """Fill missing values from ``torch.distributed``, then torchrun's environment, then 0/1."""
        if rank is None or world_size is None:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world_size = dist.get_world_size() if world_size is None else world_size
        if rank is None:
            rank = int(os.environ.get("RANK", 0))
        if world_size is None:
            world_size = int(os.environ.get("WORLD_SIZE", 1))
        return Topology(rank=rank, world_size=world_size)


def owned_shards(rank: int, world_size: int, n_shards: int) -> range:
    """Logical shards of ``rank``: ``[floor(r L / W), floor((r + 1) L / W))``.

    Raises:
        ConfigError: More ranks than logical shards.
    """
    if world_size > n_shards:
        raise ConfigError(
            f"logical_shards={n_shards} is fewer than world_size={world_size}: every rank needs "
            "at least one logical shard (use a multiple of the largest world size you will run)"
        )
    return range(rank * n_shards // world_size, (rank + 1) * n_shards // world_size)


def worker_shards(
    n_local: int, worker: int, num_workers: int, batch_size: int | None = None
) -> list[int]:
    """Rank-local shard indices handled by one DataLoader worker.

    With ``batch_size`` given and the rank's shards falling into runs of ``batch_size``
    that divide evenly among the workers, worker ``w`` takes runs ``w, w + W, ...``: a
    round-robin deal from a run boundary then takes a whole batch from one worker. Otherwise
    (or after a rescale leaves the deal off a boundary, until it levels) batches mix workers'
    rows, which the main process gathers; either way every worker holds as many shards.
    """
    if batch_size and n_local % batch_size == 0 and (n_local // batch_size) % num_workers == 0:
        runs = range(worker, n_local // batch_size, num_workers)
        return [run * batch_size + i for run in runs for i in range(batch_size)]
    return list(range(worker, n_local, num_workers))


class RowDealer:
    """Deals batch rows to a rank's shards: fewest lines emitted first, lowest index on ties.

    While the shards are level (each has emitted ``c`` or ``c + 1`` lines, the ``c + 1``
    ones first) the rule is plain round-robin and is dealt with a pointer; after a rescale
    leaves them uneven, a heap deals until they are level again.

    Args:
        emitted: Lines already emitted by each rank-local shard.
    """

    def __init__(self, emitted: list[int]):
        self._counts = list(emitted)
        self._next = _level_pointer(self._counts)

    def deal(self, batch_size: int) -> list[int]:
        """Rank-local shard index of each row of the next batch."""
        n = len(self._counts)
        if self._next is not None:
            start = self._next
            self._next = (start + batch_size) % n
            return [(start + k) % n for k in range(batch_size)]
        heap = [(count, i) for i, count in enumerate(self._counts)]
        heapq.heapify(heap)
        rows = []
        for _ in range(batch_size):
            count, i = heap[0]
            rows.append(i)
            heapq.heapreplace(heap, (count + 1, i))
        for count, i in heap:
            self._counts[i] = count
        self._next = _level_pointer(self._counts)
        return rows


def _level_pointer(counts: list[int]) -> int | None:
    """The next shard to deal if ``counts`` is level (``[c + 1] * p + [c] * (n - p)``)."""
    low = min(counts)
    higher = [i for i, count in enumerate(counts) if count != low]
    if any(counts[i] != low + 1 for i in higher) or higher != list(range(len(higher))):
        return None
    return len(higher) % len(counts)
