"""The ``workers`` section: the processes that prepare batches, and what they hold."""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from fmsdata.config.section import Section, checked
from fmsdata.config.values import flag, non_negative_int, number, one_of, positive_int, set_field

__all__ = ["WorkersConfig", "StartMethod"]

StartMethod = Literal["fork", "spawn", "forkserver"]
_TIMEOUT = number(
    float,
    "a non-negative number of seconds or None (0 and None: wait forever)",
    lambda seconds: 0 <= seconds < float("inf"),
    optional=True,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkersConfig(Section):
    """How many worker processes a rank runs and how they hand batches over; none of it
    changes which tokens come.

    Attributes:
        num_workers: DataLoader worker processes per rank.
        prefetch_factor: Items (a few dozen batches of its rows) each worker prepares
            ahead; the workers' shared batch ring holds prefetch_factor + 2 items.
        pin_memory: Pin batch tensors (for asynchronous host-to-device copies).
        multiprocessing_context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or None (default).
        open_files: Shard files each worker keeps open at most (least recently used closed);
            None sizes it from the streams the worker runs.
        worker_timeout: Seconds the main process waits for a worker's next item (a few
            dozen batches) before it asks the worker for its Python stack and raises
            ``WorkerStalledError`` naming the worker, its logical shards, the stage and file
            it is in, and the stack. The default, 600, is far beyond any healthy item
            (downloading a worker's first files from object storage included); None or 0
            waits forever. A dead worker is reported at once, whatever this is. Without
            workers (``num_workers=0``) the stages run in the training process itself,
            where nothing can watch them.
    """

    num_workers: int = checked(1, non_negative_int)
    prefetch_factor: int = checked(2, positive_int)
    pin_memory: bool = checked(False, flag)
    multiprocessing_context: StartMethod | None = checked(
        None, one_of((None, *get_args(StartMethod)), "fork, spawn, forkserver or None")
    )
    open_files: int | None = checked(
        None, number(int, "a positive integer or None", lambda n: n > 0, optional=True)
    )
    worker_timeout: float | None = checked(600.0, _TIMEOUT)

    def _check(self) -> None:
        set_field(self, "worker_timeout", self.worker_timeout or None)
