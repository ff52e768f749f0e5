"""Name the mapped shard files in the stack dump of a process killed by a fault.

A shard cut short while it is memory mapped kills the reading process with SIGBUS on the
next read of a page past the new end. Python cannot run code on such a fault (a Python
signal handler only runs between bytecodes, never inside the C copy that faults), so no
``signal.signal(SIGBUS, ...)`` can say which file it was. ``faulthandler`` can: its C
handler prints every thread's stack before the process dies. ``start`` runs a sleeping
thread whose current frame is a function compiled under a file name that lists the
mapped shard files; the dump then shows, for instance::

    Thread 0x... (most recent call first):
      File "<fmsdata: mapped shard files: /data/web/part_000.npy>", line 2 in mapped_files

``update`` (called when files are mapped or closed) moves the thread into a new frame
and waits until it is parked there, so the dump is right from then on (a thread switch
per file opened). faulthandler shortens long file names (to 500 characters).
"""

from __future__ import annotations

import faulthandler
import functools
import os
import threading
from collections.abc import Callable, Iterable

__all__ = ["start", "update"]

_SOURCE = "def mapped_files(wait):\n    wait()\n"
_changed = threading.Condition()
_state: dict[str, object] = {
    "version": 0,
    "parked": -1,
    "files": (),
    "thread": None,
    "fork_hook": False,
}
_HANDSHAKE = 1.0  # seconds an update waits for the thread at most


def start() -> None:
    """Turn on ``faulthandler`` (if off) and the thread that names mapped files in it."""
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)
    if not _state["fork_hook"]:
        os.register_at_fork(after_in_child=_forget_after_fork)
        _state["fork_hook"] = True
    with _changed:
        if _state["thread"] is None:
            thread = threading.Thread(target=_run, name="fmsdata-mapped-files", daemon=True)
            _state["thread"] = thread
            thread.start()
        _wait_parked()


def update(files: Iterable[str]) -> None:
    """Record the currently mapped files (cheap when no note thread runs)."""
    with _changed:
        _state["files"] = tuple(files)
        _state["version"] = int(_state["version"]) + 1  # type: ignore[call-overload]
        _changed.notify_all()
        if _state["thread"] is not None:
            _wait_parked()


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


def _run() -> None:
    while True:
        with _changed:
            version, files = _state["version"], _state["files"]
        name = "<fmsdata: mapped shard files: " + ", ".join(files) + ">"  # type: ignore[arg-type]
        namespace: dict[str, Callable[[Callable[[], None]], None]] = {}
        exec(compile(_SOURCE, name, "exec"), namespace)  # noqa: S102  (our own constant source)
        namespace["mapped_files"](functools.partial(_wait, version))


def _wait(version: object) -> None:
    with _changed:
        _state["parked"] = version
        _changed.notify_all()
        _changed.wait_for(lambda: _state["version"] != version)
