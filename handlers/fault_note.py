"""Name the mapped shard files in the stack dump of a process killed by a fault.

A shard cut short while it is memory mapped kills the reading process with SIGBUS on the
next read of a page past the new end. Python cannot run code on such a fault (a Python
signal handler only runs between bytecodes, never inside the C copy that faults), so no
``signal.signal(SIGBUS, ...)`` can say which file it was. ``faulthandler`` can: its C
handler prints every thread's stack before the process dies. ``start`` runs a sleeping
thread whose current frame is a function compiled under a file name that says where the
process lists its mapped files and names the newest of them; the dump then shows::

    Thread 0x... (most recent call first):
      File "<fmsdata: mapped shard files: 840, all listed in /tmp/fmsdata-maps-4242.tsv;
      newest: /data/web/part_000.npy, ...>", line 2 in mapped_files

The list file (``fmsdata.handlers.mapping``) is written before a mapped file is read, so
it is complete at any fault; the name in the frame only points to it. That is why
``update`` does not wait for the thread: it records the new names and the thread moves to
a new frame when it next runs, taking every update since in one move (a process opening
thousands of files pays no thread switch per file). faulthandler cuts a file name at 500
characters, so the frame names only the newest files.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["running", "start", "update"]

_SOURCE = "def mapped_files(wait):\n    wait()\n"
_changed = threading.Condition()
_state: dict[str, object] = {
    "version": 0,
    "parked": -1,
    "newest": (),
    "count": 0,
    "listed_in": None,
    "thread": None,
    "fork_hook": False,
}
_HANDSHAKE = 1.0  # seconds ``start`` waits for the thread at most
_GATHER = 0.01  # seconds the thread lets updates gather before it moves to a new frame


def start() -> None:
    """Turn on ``faulthandler`` (if off) and the thread that names mapped files in it,
    with every file mapped so far listed."""
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)
    if not _state["fork_hook"]:
        os.register_at_fork(after_in_child=_forget_after_fork)
        _state["fork_hook"] = True
    with _changed:
        started = _state["thread"] is None
        if started:
            thread = threading.Thread(target=_run, name="fmsdata-mapped-files", daemon=True)
            _state["thread"] = thread
            thread.start()
    if started:
        from fmsdata.handlers import mapping  # imports this module: imported on first use

        mapping.publish()
    with _changed:
        _wait_parked()


def running() -> bool:
    """Whether this process's note thread runs (``start`` was called here)."""
    return _state["thread"] is not None


def update(newest: Sequence[str], count: int, listed_in: str | None) -> None:
    """Record the newest mapped files, how many are mapped and where all are listed; the
    thread takes them into its frame when it next runs (cheap: no wait)."""
    with _changed:
        _state.update(newest=tuple(newest), count=count, listed_in=listed_in)
        _state["version"] = int(_state["version"]) + 1  # type: ignore[call-overload]
        _changed.notify_all()


def _forget_after_fork() -> None:
    """A forked child (a DataLoader worker) has no note thread, and a lock the parent's
    thread held would stay held: start afresh."""
    global _changed
    _changed = threading.Condition()
    _state.update(thread=None, parked=-1)


def _wait_parked() -> None:
    """With ``_changed`` held: wait until the thread sleeps in the frame of this version."""
    version = _state["version"]
    _changed.wait_for(lambda: _state["parked"] == version, timeout=_HANDSHAKE)


def _name(count: object, listed_in: object, newest: Sequence[str]) -> str:
    where = f", all listed in {listed_in}" if listed_in else ""
    return f"<fmsdata: mapped shard files: {count}{where}; newest: {', '.join(newest)}>"


def _run() -> None:
    while True:
        with _changed:
            version = _state["version"]
            name = _name(_state["count"], _state["listed_in"], _state["newest"])  # type: ignore[arg-type]
        namespace: dict[str, Callable[[Callable[[], None]], None]] = {}
        exec(compile(_SOURCE, name, "exec"), namespace)  # noqa: S102  (our own constant source)
        namespace["mapped_files"](functools.partial(_wait, version))


def _wait(version: object) -> None:
    """Sleep in this frame until the names change, then a moment longer (in the same
    frame) so that a burst of updates makes one move."""
    with _changed:
        _state["parked"] = version
        _changed.notify_all()
        _changed.wait_for(lambda: _state["version"] != version)
    time.sleep(_GATHER)
