"""The one exit registry: work that must finish while the interpreter is still whole.

A loader closes its workers and open files at exit; an automatic checkpoint finishes the
save in flight (its thread is a daemon, so without this the interpreter would cut the
state file short). Both register here, and one ``atexit`` hook, registered the first
time something registers (nothing happens at import), runs them: the ones kept weakly
first (a loader's ``close`` waits for its own save), then the held ones (a save whose
loader may be gone). A failure is logged and the rest still run.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from collections.abc import Callable

__all__ = ["finish_at_exit", "release"]

logger = logging.getLogger(__name__)

# Keyed by id() of the method's object; a weak entry leaves when its object goes.
_weak: dict[int, tuple[weakref.WeakMethod, str]] = {}
_held: dict[int, tuple[Callable[[], None], str]] = {}
_hooked = False


def finish_at_exit(method: Callable[[], None], what: str, hold: bool = False) -> None:
    """Call the bound ``method`` at interpreter exit (``what`` names it in the log if it
    fails). With ``hold`` its object is kept alive until ``release``; without, it is
    referenced weakly and forgotten when collected."""
    global _hooked
    if not _hooked:
        atexit.register(_finish_all)
        _hooked = True
    owner = method.__self__  # type: ignore[attr-defined]
    key = id(owner)
    if hold:
        _held[key] = (method, what)
    else:
        _weak[key] = (weakref.WeakMethod(method, lambda _: _weak.pop(key, None)), what)  # type: ignore[arg-type]


def release(method: Callable[[], None]) -> None:
    """Nothing to do at exit for ``method``'s object any more (held or weak)."""
    key = id(method.__self__)  # type: ignore[attr-defined]
    _held.pop(key, None)
    _weak.pop(key, None)


def _finish_all() -> None:
    weak = [(ref(), what) for ref, what in list(_weak.values())]
    for method, what in [*weak, *list(_held.values())]:
        if method is None:
            continue
        try:
            method()
        except Exception:
            logger.exception("%s at interpreter exit failed", what)
