"""Running an iterator on a side thread, a bounded number of values ahead.

The loader assembles batches into pinned memory this way (as torchdata's ``PinMemory``
node does): the copies happen on a thread of their own, so the training thread only
takes finished batches. Exceptions raised by the iterator reach the consumer, in order.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import torch

__all__ = ["AheadThread"]

T = TypeVar("T")
_END = object()
_POLL_S = 0.1


class AheadThread(Generic[T]):
    """Iterate ``source`` on a daemon thread, at most ``depth`` values ahead of the reader.

    ``close()`` stops the thread (it finishes the value in hand, then closes ``source``);
    the reader must call it when it stops early. The thread uses the CUDA device that was
    current where it was created, so pinned memory belongs to the caller's device.
    """

    def __init__(self, source: Iterator[T], depth: int):
        self._queue: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(depth)
        self._stop = threading.Event()
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        self._thread = threading.Thread(
            target=self._run, args=(source, device), name="fmsdata-pin", daemon=True
        )
        self._done = False
        self._thread.start()

    def _run(self, source: Iterator[T], device: int | None) -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)
            for value in source:
                if not self._put((value, None)):
                    return
            self._put((_END, None))
        except BaseException as err:  # handed to the reader, raised there
            self._put((None, err))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _put(self, entry: tuple[Any, BaseException | None]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> AheadThread[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        while True:
            try:
                value, error = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise RuntimeError("the batch assembly thread ended unexpectedly") from None
        if error is not None:
            self._done = True
            raise error
        if value is _END:
            self._done = True
            raise StopIteration
        return value

    def close(self) -> None:
        """Stop the thread and wait for it (values it assembled ahead are dropped)."""
        self._done = True
        self._stop.set()
        self._thread.join()
