"""Local paths for shard files named relative to a data root.

Handlers read local files (memory maps); a root on the local filesystem is used in place,
any other fsspec URL is fetched into a local cache first.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from collections.abc import Callable

import fsspec

__all__ = ["local_path_resolver"]


def local_path_resolver(root: str) -> Callable[[str], str]:
    """A function from a root-relative path to a readable local file path."""
    fs, base = fsspec.core.url_to_fs(root)
    base = base.rstrip("/")
    if "file" in fs.protocol or "local" in fs.protocol:
        return lambda relative: os.path.join(base, relative)
    cache_dir = tempfile.mkdtemp(prefix="fmsdata-cache-")

    def fetch(relative: str) -> str:
        target = os.path.join(cache_dir, relative)
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            partial = target + ".tmp"
            fs.get_file(posixpath.join(base, relative), partial)
            os.replace(partial, target)
        return target

    return fetch
