"""What the remote cache did, seen from outside it: the files its evictions removed.

``logging_removal`` wraps the cache's removal of a file so that each one it makes appends
a line to a log file (``O_APPEND``: lines of several processes never mix); installed as
``usage.remove_unless_held`` (a test's monkeypatch, or a rank process started for a test),
it logs in that process and in the DataLoader workers it forks.
``evicted`` reads the log back as counts by root-relative path. Overcounting (a file
another process removed at the same moment) only loosens the bounds tests draw from it.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable

from fmsdata.remote import usage

__all__ = ["evicted", "logging_removal"]


def logging_removal(log: str) -> Callable[[str], bool]:
    """``usage.remove_unless_held`` that appends each cached file it removes to ``log``."""
    remove = usage.remove_unless_held

    def logged(path: str) -> bool:
        present = os.path.exists(path)
        gone = remove(path)
        if present and gone:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (path + "\n").encode())
            finally:
                os.close(fd)
        return gone

    return logged


def evicted(log: str, cache_dir: str) -> collections.Counter[str]:
    """Evictions by path under the root, from the log of a loader with ``cache_dir``."""
    found: collections.Counter[str] = collections.Counter()
    if not os.path.exists(log):
        return found
    base = os.path.join(cache_dir, "remote")
    with open(log, encoding="utf-8") as lines:
        for line in lines:
            relative = os.path.relpath(line.rstrip("\n"), base)
            found[relative.split(os.sep, 1)[1].replace(os.sep, "/")] += 1  # past the root key
    return found
