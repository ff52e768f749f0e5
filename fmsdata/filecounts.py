"""Per-file document and token counts, found once per process and shared by every shard.

A resume sets up every logical shard a rank owns, and each shard's streams and saved
lines ask for the document counts of their files. Counted per shard (or per chain built
to check a state), that is O(files x shards) reader opens — and on an object store, a
download of every file. Here each count is kept once per process, keyed by the root, the
file's path under it and its listed byte size (a rewritten file of another size is
counted again), whichever way it was found: the root's ``meta/counts.csv``, a read of
the format's metadata (``fmsdata.metacount``: footers and headers fetched with range
requests, never the shard bodies), or a reader opened on the file.
"""

from __future__ import annotations

import threading

__all__ = ["recall", "remember", "forget_all", "UNKNOWN"]

UNKNOWN = -1

# (root, relative path, listed size) -> (documents, tokens or UNKNOWN)
_COUNTS: dict[tuple[str, str, int], tuple[int, int]] = {}
_LOCK = threading.Lock()


def _key(root: str, relative: str, size: int) -> tuple[str, str, int]:
    return root.rstrip("/"), relative, int(size)


def recall(root: str, relative: str, size: int) -> tuple[int, int] | None:
    """``(documents, tokens)`` of a file counted before in this process (tokens may be
    ``UNKNOWN``), or None."""
    return _COUNTS.get(_key(root, relative, size))


def remember(root: str, relative: str, size: int, docs: int, tokens: int = UNKNOWN) -> None:
    """Record a file's counts for the rest of the process (a known token count is kept
    when a later call does not know it)."""
    key = _key(root, relative, size)
    with _LOCK:
        if tokens < 0:
            old = _COUNTS.get(key)
            if old is not None and old[0] == docs:
                tokens = old[1]
        _COUNTS[key] = (int(docs), int(tokens))


def forget_all() -> None:
    """Drop every count (tests, and roots whose files were rewritten in place)."""
    with _LOCK:
        _COUNTS.clear()
