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
call of a compiled function.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["compiled"]

_log = logging.getLogger(__name__)
_lock = threading.Lock()


class _Compiled:
    """A function compiled with ``numba.njit(cache=True, nogil=True)`` on its first call."""

    def __init__(self, func: Callable[..., Any]):
        self.func = func
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

                try:
                    self.dispatcher = numba.njit(cache=True, nogil=True)(self.func)
                except RuntimeError as error:  # numba found no writable cache location
                    _log.warning(
                        "%s.%s: compiled code cannot be cached on disk (%s); compiling it in "
                        "memory in every process. Set NUMBA_CACHE_DIR to a writable folder.",
                        self.__module__,
                        self.__name__,
                        error,
                    )
                    self.dispatcher = numba.njit(nogil=True)(self.func)
            return self.dispatcher


def compiled(func: Callable[..., Any]) -> Any:
    """Decorate ``func`` (numba-compatible code) to be compiled on its first call."""
    return _Compiled(func)
