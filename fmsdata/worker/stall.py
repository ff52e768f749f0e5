"""Where a DataLoader worker is, asked from the main process: its Python stack, the stage
and the file it is in. What ``WorkerStalledError`` says about a worker that sent nothing
for ``worker_timeout`` seconds.

Each worker arms itself as it starts (``arm``): an anonymous temporary file (unlinked at
creation: nothing is left on disk whatever kills the worker), whose descriptor number it
writes into a shared tensor; ``faulthandler`` registered on ``STACK_SIGNAL`` to write
every thread's stack into it, chained to a Python handler that adds the stage and the
file. faulthandler's handler is C: it answers however the worker is stuck (in a C call
holding the GIL too). The Python handler runs at the worker's next bytecode, so it answers
a worker sleeping or waiting in Python, not one stuck in C; its lines end with ``_END``.

The main process (``ask``) sends the signal and reads the file through
``/proc/PID/fd/FD`` (Linux), waiting a moment for the Python handler's lines. Nothing
runs in the worker until it is asked: arming costs a file and two signal handlers per
worker, and no item pays anything.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import tempfile
import threading
import time
from types import FrameType
from typing import IO, Any

from fmsdata.stages.base import Stage

__all__ = ["STACK_SIGNAL", "Whereabouts", "arm", "watch", "ask"]

# SIGUSR1 is taken by schedulers and trainers (SLURM's --signal, Lightning's requeue).
STACK_SIGNAL = getattr(signal, "SIGUSR2", None)
_END = "-- end of fmsdata's worker report --"
_STAGE = "stage: "
_FILE = "file: "

# This process's stack file and what ``watch`` registered (the worker's open readers and
# its datasets' file lists), kept for the worker's life.
_armed: dict[str, Any] = {"pid": None, "file": None, "readers": None, "accesses": None}


def arm(fds: Any, worker: int) -> None:
    """In a worker: register the stack dump, and write the stack file's descriptor into
    ``fds[worker]`` (a shared int64 tensor; None: not asked for). Runs on the worker's
    main thread (where torch runs the dataset and signal handlers are set)."""
    if fds is None or STACK_SIGNAL is None or not os.path.isdir("/proc/self/fd"):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if _armed["pid"] != os.getpid():
        handle: IO[bytes] = tempfile.TemporaryFile()
        signal.signal(STACK_SIGNAL, _describe)
        faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=True)
        _armed.update(pid=os.getpid(), file=handle, readers=None, accesses=None)
    fds[worker] = _armed["file"].fileno()


def watch(readers: Any, accesses: Any) -> None:
    """Name, in a report, the file of ``readers`` (a ``ReaderCache``) used last, by the
    paths of ``accesses`` (the worker's ``DatasetAccess`` list)."""
    _armed.update(readers=readers, accesses=accesses)


def _describe(signum: int, frame: FrameType | None) -> None:
    """The Python handler: the stage the interrupted frame is in and the file last read,
    appended after faulthandler's stack."""
    lines = [_STAGE + _stage_of(frame), _FILE + _last_file()]
    try:
        os.write(_armed["file"].fileno(), ("\n".join(lines) + f"\n{_END}\n").encode())
    except (OSError, AttributeError):
        pass


def _stage_of(frame: FrameType | None) -> str:
    """The innermost stage on the stack (``module.Class``, the stages it runs under after
    it), or where the worker is when it is in no stage."""
    stages: list[str] = []
    where = ""
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Stage):
            name = f"{type(owner).__module__}.{type(owner).__qualname__}"
            if not stages or stages[-1] != name:
                stages.append(name)
        elif not stages and not where:
            code = frame.f_code
            where = f"{code.co_name} ({code.co_filename}:{frame.f_lineno})"
        frame = frame.f_back
    if not stages:
        return f"none (in {where or 'no Python frame'})"
    inner, outer = stages[0], stages[1:]
    return inner + (f", inside {' < '.join(outer)}" if outer else "")


def _last_file() -> str:
    """The file whose reader the worker used last, or why none is known."""
    readers, accesses = _armed["readers"], _armed["accesses"]
    opened = list(getattr(readers, "_open", ()))
    if not opened or accesses is None:
        return "none opened yet"
    index, file = opened[-1]
    try:
        access = accesses[index]
        relative, root = str(access.path(file)), str(access.root)
    except (IndexError, AttributeError, TypeError):
        return "unknown"
    return f"{root.rstrip('/')}/{relative}" if root else relative


@dataclasses.dataclass(frozen=True)
class Whereabouts:
    """What a worker said when asked: its stage, its file, its threads' stacks.

    Attributes:
        stage: The innermost stage it is in (``module.Class``), or where it is; None when
            its Python handler did not answer (stuck in C code holding the GIL).
        file: The file it read last; None likewise.
        stack: faulthandler's dump of its threads, empty where none could be read.
    """

    stage: str | None
    file: str | None
    stack: str


def ask(pid: int, fd: int, wait: float = 2.0) -> Whereabouts:
    """Ask worker ``pid`` (armed, its stack file at descriptor ``fd``) where it is: its
    stack at once, its stage and file within ``wait`` seconds if its Python runs."""
    if STACK_SIGNAL is None or fd <= 0:
        return Whereabouts(None, None, "")
    path = f"/proc/{pid}/fd/{fd}"
    try:
        os.kill(pid, STACK_SIGNAL)
    except OSError:
        return Whereabouts(None, None, "")
    deadline = time.monotonic() + wait
    text = ""
    while True:
        try:
            with open(path, "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            break
        if _END in text or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    stack, _, report = text.partition(f"\n{_STAGE}")
    if not report:
        return Whereabouts(None, None, text.strip())
    found = dict(line.split(": ", 1) for line in (_STAGE + report).splitlines() if ": " in line)
    return Whereabouts(found.get("stage"), found.get("file"), stack.strip())
