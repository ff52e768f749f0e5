"""Per-file document and token counts, found once per process and shared by every shard.

A resume sets up every logical shard a rank owns, and each shard's streams and saved
lines ask for the document counts of their files. Counted per shard (or per chain built
to check a state), that is O(files x shards) reader opens — and on an object store, a
download of every file. Here each count is kept once per process, keyed by the root, the
file's path under it and its listed byte size (a rewritten file of another size is
counted again), whichever way it was found: the root's ``meta/counts.csv``, a read of
the format's metadata (``fmsdata.data.metacount``: footers and headers fetched with range
requests, never the shard bodies), or a reader opened on the file. Counts read from a
remote root's metadata are also kept on disk in the cache folder (``load_disk`` /
``save_disk``), so the next process on the machine does not fetch the footers again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading

__all__ = [
    "UNKNOWN",
    "disk_path",
    "forget_all",
    "load_disk",
    "recall",
    "remember",
    "save_disk",
]

logger = logging.getLogger(__name__)

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


# On disk: the counts a process found from a remote root's metadata, for the next process
# on this machine (each rank, each restart) to skip the footer reads. One file per root in
# the cache folder, keyed per file by what the listing says of it: path, size and its
# version (ETag or modification time), so a file rewritten in place is counted again.
_DISK_HEADER = "# fmsdata counts cache: path\tsize\tversion\tdocuments\ttokens; root="
Listed = tuple[str, int, str]  # (relative path, size, version)


def disk_path(folder: str, root: str) -> str:
    """The counts cache file of ``root`` in ``folder``."""
    digest = hashlib.blake2b(root.rstrip("/").encode(), digest_size=10).hexdigest()
    return os.path.join(folder, f"{digest}.tsv")


def load_disk(folder: str, root: str) -> dict[Listed, tuple[int, int]]:
    """The counts cached for ``root`` (empty when none, or when the file is not one this
    module wrote for that root: a cache is never a reason to fail)."""
    path = disk_path(folder, root)
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    if not lines or lines[0] != _DISK_HEADER + root.rstrip("/"):
        logger.warning("ignoring %s: not the counts cache of %s", path, root)
        return {}
    found: dict[Listed, tuple[int, int]] = {}
    for line in lines[1:]:
        fields = line.split("\t")
        try:
            relative, size, version, docs, tokens = fields
            found[(relative, int(size), version)] = (int(docs), int(tokens))
        except ValueError:
            logger.warning("ignoring %s: line %r is not path, size, version and counts", path, line)
            return {}
    return found


def save_disk(folder: str, root: str, counts: dict[Listed, tuple[int, int]]) -> None:
    """Write ``root``'s counts cache (atomically: ``*.tmp`` then ``os.replace``); a cache
    that cannot be written is only logged."""
    path = disk_path(folder, root)
    lines = [_DISK_HEADER + root.rstrip("/")]
    lines += [f"{r}\t{s}\t{v}\t{d}\t{t}" for (r, s, v), (d, t) in sorted(counts.items())]
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"  # ranks of one machine may write at once
        with open(tmp, "w", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
        os.replace(tmp, path)
    except OSError as err:
        logger.warning("could not write the counts cache %s (%s)", path, err)
