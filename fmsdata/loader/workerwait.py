"""The main process's wait for its workers' items, bounded: a worker that sends nothing
for ``worker_timeout`` seconds is a ``WorkerStalledError``, one that died a
``WorkerDiedError``, each naming the worker, its logical shards and what is known of it.

``WatchedItems`` wraps the DataLoader iterator. It lets torch wait at most ``POLL_S``
seconds at a time (torch's ``timeout``; the loop torch runs without one polls at the same
interval to notice dead workers) and counts the time since it began to wait for the item
due. Past ``worker_timeout`` it asks the worker due for its whereabouts
(``fmsdata.worker.stall``), stops it and raises. A worker that is due is the one whose
item comes next: items come in order, one per worker in turn.

Nothing here runs per batch: one ``time.monotonic()`` per item (a few dozen batches), and
the rest only once torch has waited ``POLL_S`` in vain.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from fmsdata.errors import WorkerDiedError, WorkerStalledError
from fmsdata.worker import stall

__all__ = ["POLL_S", "WatchedItems", "poll_seconds", "dead_workers", "died_error", "worker_name"]

# Seconds torch waits for an item before it gives the wait back (torch's own interval of
# checking that its workers live, ``MP_STATUS_CHECK_INTERVAL``).
POLL_S = 5.0
_TIMED_OUT = "DataLoader timed out after"


def poll_seconds(worker_timeout: float | None) -> float:
    """torch's ``timeout`` for a loader with workers: 0 (its own loop) without a timeout."""
    return 0.0 if not worker_timeout else min(POLL_S, worker_timeout)


class WatchedItems:
    """The items of a DataLoader iterator (``parts``, made with ``timeout=poll_seconds``),
    waiting for each at most ``worker_timeout`` seconds.

    Args:
        parts: torch's iterator over the workers' items.
        worker_timeout: Seconds without an item before the worker due is stalled (None:
            wait forever).
        pids, stacks: The shared tensors the workers write their process id and stack file
            into (``fmsdata.worker.dataset.Start``).
        shards: The logical shards of each worker (a list, not a method of the loader:
            the loader holds this, which must not hold the loader back).
    """

    def __init__(
        self,
        parts: Iterator[Any],
        worker_timeout: float | None,
        pids: torch.Tensor,
        stacks: torch.Tensor,
        shards: Sequence[Sequence[int]],
    ):
        self.parts = parts
        self.timeout = worker_timeout
        self.pids, self.stacks, self.shards = pids, stacks, shards
        self._received = 0  # items received: the worker due is this modulo the workers

    def __iter__(self) -> WatchedItems:
        return self

    def __next__(self) -> Any:
        started = time.monotonic()
        while True:
            try:
                item = next(self.parts)
            except RuntimeError as err:
                if self.timeout is None or _TIMED_OUT not in str(err):
                    raise
                waited = time.monotonic() - started
                if waited < self.timeout:
                    continue  # torch waits POLL_S at a time: nothing is lost by asking again
                raise self._stalled(waited) from None
            self._received += 1
            return item

    def _due(self) -> int:
        """The worker whose item comes next (torch's bookkeeping where it has it)."""
        try:
            parts: Any = self.parts
            return int(parts._task_info[parts._rcvd_idx][0])
        except (AttributeError, KeyError, IndexError, TypeError):
            return self._received % len(self.pids)

    def _stalled(self, waited: float) -> WorkerStalledError:
        """The error naming the worker due, with what it said of itself; the worker is
        stopped (it would hold the shutdown of the others for torch's 5 s join)."""
        worker = self._due()
        pid, fd = int(self.pids[worker]), int(self.stacks[worker])
        where = stall.ask(pid, fd) if pid else stall.Whereabouts(None, None, "")
        _forget_workers(self.parts)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        name = worker_name(worker, pid, self.shards[worker])
        if not pid:
            said = "it never started (it wrote no process id)"
        elif where.stage is None:
            said = (
                "it did not answer in Python within 2 s (stuck in C code holding the GIL, "
                "or not armed); its stack shows where"
            )
        else:
            said = f"it is in stage {where.stage}; the file it read last: {where.file}"
        stack = where.stack or "(no stack could be read)"
        return WorkerStalledError(
            f"{name} sent no item for {waited:.0f} s (worker_timeout={self.timeout:g}): {said}. "
            f"The worker was stopped. Its Python stack:\n{stack}"
        )


def worker_name(worker: int, pid: int, shards: Sequence[int]) -> str:
    """``DataLoader worker 1 (pid 4242, logical shards [1, 3])``."""
    return f"DataLoader worker {worker} (pid {pid or '?'}, logical shards {list(shards)})"


def _forget_workers(parts: Any) -> None:
    """Take the workers of ``parts`` off torch's SIGCHLD watch: one stopped here would
    otherwise raise torch's own error at whatever line the main thread is on."""
    try:
        from torch.utils.data._utils import signal_handling

        if getattr(parts, "_worker_pids_set", False):
            signal_handling._remove_worker_pids(id(parts))
            parts._worker_pids_set = False
    except (ImportError, AttributeError, RuntimeError, KeyError):
        pass


def dead_workers(parts: Any) -> list[tuple[int, int]]:
    """``(worker, exit code)`` of the workers of ``parts`` (torch's iterator) that ended
    other than cleanly; an exit code below 0 is the signal that killed it."""
    found = []
    for worker, process in enumerate(getattr(parts, "_workers", ())):
        try:
            code = process.exitcode
        except (AttributeError, ValueError, OSError):
            continue
        if code is not None and code != 0:
            found.append((worker, code))
    return found


def died_error(
    parts: Any,
    dead: list[tuple[int, int]],
    pids: Sequence[int],
    shards_of: Callable[[int], Sequence[int]],
    cause: BaseException,
) -> WorkerDiedError:
    """The error naming each dead worker of ``parts`` (torch's iterator), its logical
    shards and how it ended. The workers of ``parts`` leave torch's SIGCHLD watch: a
    traceback kept by the caller keeps ``parts`` alive, and torch would raise its own
    error about the dead worker again at the next SIGCHLD this process gets (any child
    process ending), at whatever line the main thread is on."""
    _forget_workers(parts)
    parts = []
    for worker, code in dead:
        name = worker_name(worker, pids[worker] if worker < len(pids) else 0, shards_of(worker))
        parts.append(f"{name} {_ended(code)}")
    return WorkerDiedError(
        f"{'; '.join(parts)}. A worker killed by SIGKILL is most often the OS's out-of-memory "
        f"killer (see dmesg) or a kill by the scheduler; the run cannot go on without it "
        f"(resume from the last checkpoint). PyTorch said: {cause}"
    )


def _ended(code: int) -> str:
    """How a process with exit code ``code`` ended, in words."""
    if code < 0:
        try:
            signame = signal.Signals(-code).name
        except ValueError:
            signame = "an unknown signal"
        return f"was killed by signal {-code} ({signame})"
    return f"exited with status {code}"
