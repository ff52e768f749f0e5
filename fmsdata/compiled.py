"""Compile functions with numba on their first call, cached on disk.

The compiled loops of fmsdata (``fmsdata.stages.kernels``, ``fmsdata.permute``) are
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

Nothing happens at import: numba is imported, and a cache folder created, on the first
call of a compiled function. A compiled function may also call a numba intrinsic (code
numba cannot express, built with llvmlite) declared with ``intrinsic``: it is built when
the first function that names it compiles.
"""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Callable
from typing import Any

__all__ = ["compiled", "intrinsic"]

_log = logging.getLogger(__name__)
_lock = threading.RLock()  # compiling a function compiles the helpers it calls


class _Compiled:
    """A function compiled with ``numba.njit(cache=True, nogil=True)`` on its first call."""

    def __init__(self, func: Callable[..., Any], options: dict[str, Any]):
        self.func = func
        self.options = options  # more numba.njit options
        self.dispatcher: Any = None  # numba's dispatcher once compiled
        self.__doc__ = func.__doc__
        self.__name__ = func.__name__
        self.__qualname__ = func.__qualname__
        self.__module__ = func.__module__

    def __call__(self, *args: Any) -> Any:
        dispatcher = self.dispatcher
        if dispatcher is None:
            dispatcher = self._compile()
        return dispatcher(*args)

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

    def _with_compiled_helpers(self) -> Callable[..., Any]:
        """The function with each ``compiled`` function and ``intrinsic`` it names globally
        replaced by what numba calls (a dispatcher, an intrinsic), not the lazy wrapper
        Python sees."""
        func = self.func
        helpers = {
            name: value
            for name, value in func.__globals__.items()
            if isinstance(value, (_Compiled, _Intrinsic))
            and value is not self
            and name in func.__code__.co_names
        }
        if not helpers:
            return func
        for name, helper in helpers.items():
            if isinstance(helper, _Intrinsic) and helper.__module__ != func.__module__:
                raise TypeError(
                    f"{func.__module__}.{func.__qualname__} calls the intrinsic {name} of "
                    f"{helper.__module__}: declare intrinsics in the module that calls them "
                    "(numba's disk cache would not see an edit to it)"
                )
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
