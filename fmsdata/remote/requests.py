"""The calls a process makes to object storage, counted: what a rank costs the store.

Every remote call fmsdata makes goes through ``fmsdata.remote.retry.retrying``, which
counts each try here by kind: ``LIST`` (a listing), ``HEAD`` (a stat), ``GET`` (a read,
whole or ranged; its bytes too), ``PUT``, ``DELETE``, ``OTHER``. A call is what fmsdata
asks of fsspec: a listing answered from fsspec's listing cache is counted though no request
went out, and a listing of more than 1,000 keys takes one S3 request per 1,000. So these
are an upper bound of the requests for everything but long listings; ``benchmarks/remote.py``
counts the HTTP requests the server sees beside them.

The counts live in one int64 array per process (``counts``). A DataLoader worker counts
into a row of a shared tensor its loader gives it (``count_into``), so the main process
adds its workers' calls to its own (``FmsDataLoader.remote_calls``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["KINDS", "FIELDS", "note", "counts", "count_into", "as_dict"]

KINDS = ("LIST", "HEAD", "GET", "PUT", "DELETE", "OTHER")
FIELDS = (*KINDS, "bytes")  # the columns of a counts array
_KIND_OF = {"list": 0, "stat": 1, "look up": 1, "read": 2, "write": 3, "delete": 4}  # KINDS
_BYTES = len(KINDS)

_lock = threading.Lock()
_state: dict[str, Any] = {"counts": np.zeros(len(FIELDS), dtype=np.int64)}


def note(what: str, url: str, result: Any) -> None:
    """Count one call of kind ``what`` (``retrying``'s word) on ``url`` and, for bytes
    returned, their size."""
    kind = _KIND_OF.get(what, len(KINDS) - 1)
    size = len(result) if isinstance(result, (bytes, bytearray, memoryview)) else 0
    with _lock:
        target = _state["counts"]
        target[kind] += 1
        if size:
            target[_BYTES] += size


def counts() -> np.ndarray:
    """A copy of this process's counts (``FIELDS`` order)."""
    with _lock:
        return np.array(_state["counts"], copy=True)


def count_into(row: np.ndarray) -> None:
    """Count from now on into ``row`` (an int64 array of ``len(FIELDS)``, e.g. a worker's
    row of a shared tensor) instead of this process's own array."""
    with _lock:
        _state["counts"] = row


def as_dict(values: Any) -> dict[str, int]:
    """Counts in ``FIELDS`` order as ``{"LIST": ..., ..., "bytes": ...}``."""
    return {name: int(value) for name, value in zip(FIELDS, values)}
