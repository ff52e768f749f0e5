"""Compile functions with numba on their first call, cached on disk.

The compiled loops of fmsdata (``fmsdata.stages.kernels``, ``fmsdata.util.permute``) are
decorated with ``compiled``. Where the compiled code lives, and what happens when it
cannot be written:

- numba's own on-disk cache: ``__pycache__`` beside the module that defines the function,
  or the folder named by the ``NUMBA_CACHE_DIR`` environment variable (set it where the
  installation is read-only, e.g. to a folder in the job's scratch space); where neither
  can be written, numba's per-user cache folder. Reruns and DataLoader workers load the
  compiled code from there instead of compiling again (compiling takes a few hundred
  milliseconds per function and argument types; loading takes milliseconds, after numba
  sets itself up once per process, about half a second).
- When no location can be written, each function is compiled in memory in every process
  that calls it, after one logged warning naming it: slower to start, never wrong.

A first call does not wait for the compiler. By default (``FMSDATA_COMPILE=background``)
it runs the function as the plain Python (numpy scalars and arrays) it is written in, and
hands its argument types to one background thread, which compiles it (or loads it from the
cache) while the process goes on; once that is done, calls go to the compiled code. The
kernels are written so that both give the same results (numba's fixed-width integers wrap
as numpy's do; the tests run pipelines both ways and compare every batch), so the first
batches of a fresh process are the same batches, made without waiting for numba: from an
empty cache, compiling what the first batch needs takes 6-7 s of a 2-core machine's CPU
time, and numba's own start-up about 0.5 s even from a warm cache
(``benchmarks/cold_start.py``). ``FMSDATA_COMPILE=foreground`` compiles in the calling
thread on the first call instead (wait once, then compiled code from the first batch on),
``FMSDATA_COMPILE=python`` never compiles. ``fmsdata warm`` fills the cache ahead of time
(a container build). A fork (DataLoader workers) waits for the kernel being compiled, so
that the child never inherits a compiler lock held by a thread it does not have; the
child compiles what it needs in its own thread.

Nothing happens at import: numba is imported, and a cache folder created, on the first
compile. A compiled function may also call a numba intrinsic (code
numba cannot express, built with llvmlite) declared with ``intrinsic``: it is built when
the first function that names it compiles.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "compiled",
    "intrinsic",
    "MODES",
    "compile_mode",
    "serving",
    "kernels",
    "compiled_count",
]

_log = logging.getLogger(__name__)
_lock = threading.RLock()  # compiling a function compiles the helpers it calls

MODES = ("background", "foreground", "python")
_mode: list[str] = []  # FMSDATA_COMPILE, read at the first call (nothing at import)


def compile_mode() -> str:
    """How first calls are served: ``FMSDATA_COMPILE`` (one of ``MODES``), default
    ``background``; read once per process."""
    if not _mode:
        mode = os.environ.get("FMSDATA_COMPILE", "background").strip().lower() or "background"
        if mode not in MODES:
            _log.warning("FMSDATA_COMPILE=%r is not one of %s: using background", mode, MODES)
            mode = "background"
        _mode.append(mode)
    return _mode[0]


def _set_mode(mode: str | None) -> None:
    """Tests: serve calls as ``mode`` from now on (None: read FMSDATA_COMPILE again);
    ``python`` also bypasses code already compiled."""
    _mode[:] = [mode] if mode else []
    compile_mode()


_kernels: list[_Compiled] = []  # every compiled function, as its module defines it


def kernels() -> list[_Compiled]:
    """Every function decorated with ``compiled`` in the modules imported so far."""
    return list(_kernels)


def compiled_count() -> int:
    """How many of them this process has compiled (or loaded from the disk cache)."""
    return sum(k.ready is not None for k in _kernels)


def _type_proxy(value: Any) -> Any:
    """What numba types like ``value`` without holding it: an array becomes a tiny one of
    the same dtype, dimensions, layout (C, F or neither) and writability, so the compile
    queue keeps no buffers (nor the file mappings they view) alive. An unaligned array is
    kept as it is (rare: its proxy would need an unaligned buffer)."""
    import numpy as np

    if isinstance(value, tuple):
        return tuple(_type_proxy(v) for v in value)
    if not isinstance(value, np.ndarray) or not value.flags.aligned:
        return value
    ndim = value.ndim
    if value.flags.c_contiguous:
        proxy = np.empty((1,) * ndim, dtype=value.dtype)
    elif value.flags.f_contiguous:
        proxy = np.empty((2,) * ndim, dtype=value.dtype, order="F")
    else:
        proxy = np.empty((3,) * ndim, dtype=value.dtype)[(slice(None, None, 2),) * ndim]
    if not value.flags.writeable:
        proxy.setflags(write=False)
    return proxy


@contextlib.contextmanager
def serving(mode: str) -> Iterator[None]:
    """First calls served as ``mode`` inside the block, in this process and in the
    DataLoader workers it starts (forked: the mode; spawned: ``FMSDATA_COMPILE``). What
    ``fmsdata bench`` (its timed window must run compiled code) and ``fmsdata warm`` use."""
    previous = os.environ.get("FMSDATA_COMPILE")
    os.environ["FMSDATA_COMPILE"] = mode
    _set_mode(mode)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["FMSDATA_COMPILE"]
        else:
            os.environ["FMSDATA_COMPILE"] = previous
        _set_mode(None)


class _Background:
    """The one thread that compiles first-called functions, in the order they were first
    called, while their calls run in Python."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[_Compiled, tuple[Any, ...]]] = queue.SimpleQueue()
        self.busy = threading.Lock()  # held while compiling; a fork waits for it
        self.thread: threading.Thread | None = None
        self.guard = threading.Lock()
        self.stopping = False  # the interpreter exits: start no other compile

    def submit(self, function: _Compiled, args: tuple[Any, ...]) -> None:
        with self.guard:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="fmsdata-compile", daemon=True
                )
                self.thread.start()
                atexit.register(self.stop)
        self.jobs.put((function, args))

    def _run(self) -> None:
        while True:
            function, args = self.jobs.get()
            with self.busy:
                if self.stopping:
                    return
                function._compile_for(args)
            del function, args  # hold no arrays while waiting

    def stop(self) -> None:
        """At interpreter exit: let the compile in flight finish and start no other, so no
        thread is inside LLVM while the process tears its libraries down (a 4-step
        torchtitan example run once ended in "terminate called without an active
        exception" on a loaded machine; not reproduced alone, so this is a precaution).
        The wait is one kernel's compile at most. Forked DataLoader workers leave through
        ``os._exit``: no teardown there."""
        self.stopping = True
        with self.busy:
            pass

    def before_fork(self) -> None:
        self.busy.acquire()

    def after_fork_in_parent(self) -> None:
        self.busy.release()

    def after_fork_in_child(self) -> None:
        """The thread is not in the child: start afresh (what was compiled stays)."""
        self.busy.release()
        self.__init__()  # type: ignore[misc]
        for kernel in _kernels:
            kernel.submitted = False


_background = _Background()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_background.before_fork,
        after_in_parent=_background.after_fork_in_parent,
        after_in_child=_background.after_fork_in_child,
    )


class _Compiled:
    """A function compiled with ``numba.njit(cache=True, nogil=True)`` on its first call."""

    def __init__(self, func: Callable[..., Any], options: dict[str, Any]):
        self.func = func
        self.options = options  # more numba.njit options
        self.dispatcher: Any = None  # numba's dispatcher once made (compiled on demand)
        self.ready: Any = None  # the dispatcher, once compiled for a first call's types
        self.failed = False  # compiling in the background failed: the next call compiles
        self.submitted = False  # handed to the background thread (in this process)
        _kernels.append(self)
        self.__doc__ = func.__doc__
        self.__name__ = func.__name__
        self.__qualname__ = func.__qualname__
        self.__module__ = func.__module__

    def __call__(self, *args: Any) -> Any:
        ready = self.ready
        if ready is not None and _mode[0] != "python":
            return ready(*args)
        return self._first_calls(args)

    def _first_calls(self, args: tuple[Any, ...]) -> Any:
        """A call before the compiled code is ready: in Python while it compiles in the
        background, else compiled here (and kept)."""
        mode = compile_mode()
        if mode == "python" or (mode == "background" and not self.failed):
            if mode == "background" and not self.submitted:
                self._helpers()  # a misplaced intrinsic is refused by the first call
                _background.submit(self, tuple(_type_proxy(a) for a in args))
                self.submitted = True
            return self.python(*args)
        dispatcher = self._compile()
        result = dispatcher(*args)
        self.ready = dispatcher
        return result

    def python(self, *args: Any) -> Any:
        """The function run as Python: wrapping integer arithmetic is meant (numba's), so
        numpy's overflow warnings are not."""
        import numpy as np

        with np.errstate(all="ignore"):
            return self.func(*args)

    def _compile_for(self, args: tuple[Any, ...]) -> None:
        """Compile for the types of ``args`` (the background thread), or load that from
        the disk cache; then calls go to it. A failure is left for the next call to raise,
        compiling in the caller's thread."""
        try:
            dispatcher = self._compile()
            if hasattr(dispatcher, "compile"):  # not under NUMBA_DISABLE_JIT
                dispatcher.compile(tuple(dispatcher.typeof_pyval(a) for a in args))
            self.ready = dispatcher
        except Exception as error:  # noqa: BLE001 -- raised again by the caller's compile
            _log.debug("compiling %s in the background failed: %s", self.__qualname__, error)
            self.failed = True

    def _compile(self) -> Any:
        with _lock:
            if self.dispatcher is None:
                import numba  # here, not at import: importing fmsdata compiles nothing

                func = self._with_compiled_helpers()
                try:
                    self.dispatcher = numba.njit(cache=True, nogil=True, **self.options)(func)
                except RuntimeError as error:  # numba found no writable cache location
                    _log.warning(
                        "%s.%s: compiled code cannot be cached on disk (%s); compiling it in "
                        "memory in every process. Set NUMBA_CACHE_DIR to a writable folder.",
                        self.__module__,
                        self.__name__,
                        error,
                    )
                    self.dispatcher = numba.njit(nogil=True, **self.options)(func)
            return self.dispatcher

    def _helpers(self) -> dict[str, Any]:
        """The ``compiled`` functions and intrinsics the function names globally.

        Raises:
            TypeError: It names an intrinsic of another module.
        """
        func = self.func
        helpers = {
            name: value
            for name, value in func.__globals__.items()
            if isinstance(value, (_Compiled, _Intrinsic))
            and value is not self
            and name in func.__code__.co_names
        }
        for name, helper in helpers.items():
            if isinstance(helper, _Intrinsic) and helper.__module__ != func.__module__:
                raise TypeError(
                    f"{func.__module__}.{func.__qualname__} calls the intrinsic {name} of "
                    f"{helper.__module__}: declare intrinsics in the module that calls them "
                    "(numba's disk cache would not see an edit to it)"
                )
        return helpers

    def _with_compiled_helpers(self) -> Callable[..., Any]:
        """The function with each ``compiled`` function and ``intrinsic`` it names globally
        replaced by what numba calls (a dispatcher, an intrinsic), not the lazy wrapper
        Python sees."""
        func = self.func
        helpers = self._helpers()
        if not helpers:
            return func
        scope = dict(func.__globals__)
        scope.update({name: helper._compile() for name, helper in helpers.items()})
        rebound = types.FunctionType(
            func.__code__, scope, func.__name__, func.__defaults__, func.__closure__
        )
        rebound.__qualname__, rebound.__module__ = func.__qualname__, func.__module__
        return rebound


class _Intrinsic:
    """A numba intrinsic, made by ``build`` (which imports numba) when a compiled function
    that calls it compiles; ``python`` does the same in Python (a call from Python, and
    every call under ``NUMBA_DISABLE_JIT=1``)."""

    def __init__(self, build: Callable[[], Any], python: Callable[..., Any]):
        self.build = build
        self.python = python
        self.made: Any = None
        self.__doc__ = build.__doc__
        self.__name__ = build.__name__
        self.__qualname__ = build.__qualname__
        self.__module__ = build.__module__

    def __call__(self, *args: Any) -> Any:
        return self.python(*args)

    def _compile(self) -> Any:
        with _lock:
            if self.made is None:
                from numba.core import config

                jit = not getattr(config, "DISABLE_JIT", False)  # set from the environment
                self.made = self.build() if jit else self.python
            return self.made


def intrinsic(python: Callable[..., Any]) -> Callable[[Callable[[], Any]], _Intrinsic]:
    """Decorate a function that imports numba and returns a ``numba.extending.intrinsic``:
    compiled functions of its module may call that intrinsic by the decorated name.
    ``python`` is what it does, in Python.

    Declare it in the module of the functions that call it: numba's disk cache of a
    compiled function is dropped when that function's own file changes, so an edit to an
    intrinsic elsewhere would leave its callers' stale machine code in use (refused).
    """
    return lambda build: _Intrinsic(build, python)


def compiled(
    func: Callable[..., Any] | None = None, *, ieee_division: bool = False, inline: bool = False
) -> Any:
    """Decorate ``func`` (numba-compatible code) to be compiled on its first call. It may
    call other ``compiled`` functions of its module by their global names.

    ``@compiled(ieee_division=True)``: a float divided by zero gives inf or nan, as in
    numpy, instead of raising ``ZeroDivisionError`` (numba's default, Python's rule).
    """
    options: dict[str, Any] = {"error_model": "numpy"} if ieee_division else {}
    if inline:
        options["inline"] = "always"
    if func is None:
        return lambda f: _Compiled(f, options)
    return _Compiled(func, options)
