"""Where handlers keep what they derive from shard files (token caches, indexes).

Derived files are keyed by the source file's absolute path, size and modification time
plus whatever else decides their content, so an edited source never meets a stale cache.
"""

from __future__ import annotations

import hashlib
import os

from fmsdata.util.urls import local_path

__all__ = ["default_cache_dir", "derived_path"]


def default_cache_dir() -> str:
    """``$FMSDATA_CACHE``, else ``~/.cache/fmsdata``.

    Raises:
        ConfigError: ``$FMSDATA_CACHE`` is a URL (the cache is a folder on this machine).
    """
    chosen = os.environ.get("FMSDATA_CACHE")
    if chosen:
        return local_path(chosen, "$FMSDATA_CACHE", "the cache is a folder on this machine")
    return os.path.join(os.path.expanduser("~"), ".cache", "fmsdata")


def derived_path(cache_dir: str, kind: str, source: str, *parts: object) -> str:
    """``<cache_dir>/<kind>/<key>``: a stem for files derived from ``source``."""
    stat = os.stat(source)
    text = "\0".join(map(str, (os.path.abspath(source), stat.st_size, stat.st_mtime_ns, *parts)))
    return os.path.join(cache_dir, kind, hashlib.blake2b(text.encode(), digest_size=16).hexdigest())
