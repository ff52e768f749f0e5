"""What a data root holds: its datasets, their shard files, and per-file counts.

A data root (local path or fsspec URL) has one folder per dataset, each holding shard
files, possibly nested. ``meta/*counts*.csv`` (header ``dataset/filename,documents,tokens``,
the layout of the Bamba release) gives document counts without opening files; files it
does not list are counted once per process (``fmsdata.data.filecounts``): on a remote root from
the formats' metadata, read with range requests before the first shard starts
(``fmsdata.data.metacount``); on a local one by opening them, lazily and only where a logical
shard needs them.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import logging
import posixpath
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from fmsdata.data import filecounts
from fmsdata.errors import ConfigError, EmptyDatasetError, ShardFormatError
from fmsdata.handlers.base import FileHandler
from fmsdata.remote.retry import retrying
from fmsdata.remote.storage import Storage, is_local

T = TypeVar("T")

__all__ = ["DatasetFiles", "Catalog", "discover", "read_counts", "COUNTS_HEADER"]

logger = logging.getLogger(__name__)

COUNTS_HEADER = ("dataset/filename", "documents", "tokens")
META_DIR = "meta"


@dataclasses.dataclass(frozen=True)
class DatasetFiles:
    """The shard files of one dataset, in a fixed (sorted) order.

    Attributes:
        name: Folder name of the dataset under the root.
        paths: File paths relative to the root (``name/sub/shard.arrow``), sorted.
        sizes: Byte size of each file as listed.
        docs: Document count per file (counts metadata, the format's own metadata, or
            counted before in this process), -1 where unknown.
        tokens: Token count per file from the same sources, -1 where unknown.
    """

    name: str
    paths: tuple[str, ...]
    sizes: np.ndarray
    docs: np.ndarray
    tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.paths)


@dataclasses.dataclass(frozen=True)
class Catalog:
    """Datasets of a root, in the order the config names them."""

    root: str
    datasets: tuple[DatasetFiles, ...]

    def fingerprint(self) -> dict[str, str]:
        """Per dataset, a hash of its file list and sizes: changes when its data changes."""
        out = {}
        for ds in self.datasets:
            digest = hashlib.blake2b(digest_size=12)
            for path, size in zip(ds.paths, ds.sizes.tolist()):
                digest.update(f"{path}\0{size}\0".encode())
            out[ds.name] = digest.hexdigest()
        return out


class _Listing:
    """The calls the catalog makes on a root's filesystem, each retried (``Storage``)."""

    def __init__(self, root: str, storage: Storage | None):
        self.storage = storage or Storage()
        self.fs, self.base = self.storage.filesystem(root)
        self.root = root

    def call(self, what: str, fn: Callable[..., T], path: str, **kwargs: Any) -> T:
        """``fn(path, **kwargs)``, retried."""
        url = self.root.rstrip("/") + path[len(self.base) :]
        return retrying(self.storage.retry, url, fn, path, what=what, **kwargs)


def read_counts(
    root: str, names: Sequence[str], storage: Storage | None = None
) -> dict[str, tuple[int, int]]:
    """Counts metadata of a root: ``{"dataset/rel/path": (documents, tokens)}``.

    Reads every ``meta/*counts*.csv``. Paths in the file are relative to the root with an
    optional leading slash; a row whose path does not start with a known dataset folder
    is matched at the first ``/<dataset>/`` component (older releases prefix the root name).
    """
    listing = _Listing(root, storage)
    fs, meta = listing.fs, f"{listing.base}/{META_DIR}"
    try:
        names_found = listing.call("list", fs.ls, meta, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    candidates = sorted(p for p in names_found if "counts" in posixpath.basename(p))
    counts: dict[str, tuple[int, int]] = {}
    for path in candidates:
        if not path.endswith(".csv"):
            continue
        data = listing.call("read", fs.cat_file, path)
        try:
            text = io.StringIO(data.decode("utf-8"), newline="")
        except UnicodeDecodeError as err:
            raise ShardFormatError(f"{path}: counts file is not UTF-8 text ({err})") from None
        reader = csv.reader(text)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != COUNTS_HEADER:
            raise ShardFormatError(
                f"{path}: counts header must be {','.join(COUNTS_HEADER)}, got {header!r}"
            )
        for line_no, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) < 3:
                raise ShardFormatError(f"{path}:{line_no}: expected 3 fields, got {row!r}")
            key = _normalize_count_path(row[0], names)
            try:
                docs, tokens = int(row[1]), int(row[2])
            except ValueError:
                raise ShardFormatError(
                    f"{path}:{line_no}: documents and tokens must be integers, got {row!r}"
                ) from None
            if docs < 0 or tokens < 0:
                raise ShardFormatError(f"{path}:{line_no}: negative count in {row!r}")
            counts[key] = (docs, tokens)
    return counts


def _normalize_count_path(path: str, names: Sequence[str]) -> str:
    key = path.strip().lstrip("/")
    if any(key.startswith(name + "/") for name in names):
        return key
    for name in names:
        marker = f"/{name}/"
        where = key.find(marker)
        if where >= 0:
            return key[where + 1 :]
    return key


def discover(
    root: str,
    datasets: Sequence[str] | None,
    handler: FileHandler,
    storage: Storage | None = None,
    progress: Callable[[int, int], None] | None = None,
    counts_dir: str | None = None,
    count: bool = True,
) -> Catalog:
    """List the datasets and shard files of a root (reached through ``storage``), with
    each file's counts where known (see the module docstring).

    Args:
        progress: Called as ``progress(done, total)`` while the files of a remote root
            are counted from their metadata (the CLI draws a bar with it).
        counts_dir: Folder of the on-disk counts cache (``filecounts.load_disk``): a remote
            root's files counted from their metadata are kept there, keyed by path, size
            and version as listed, and a later process reads them instead of the footers.
        count: Off, a remote root's unknown counts are left unknown (-1): for a caller
            that reads the metadata itself (``fmsdata index`` also wants tokens).

    Raises:
        ConfigError: The root or a named dataset folder does not exist.
        EmptyDatasetError: A dataset folder holds no file the handler reads.
    """
    listing = _Listing(root, storage)
    fs, base = listing.fs, listing.base
    if not listing.call("stat", fs.isdir, base):
        raise ConfigError(f"data_path {root!r} does not exist or is not a folder")
    if datasets is None:
        entries = listing.call("list", fs.ls, base, detail=True)
        names = sorted(
            posixpath.basename(e["name"].rstrip("/"))
            for e in entries
            if e["type"] == "directory" and posixpath.basename(e["name"].rstrip("/")) != META_DIR
        )
        if not names:
            raise EmptyDatasetError(f"data_path {root!r} holds no dataset folder")
    else:
        names = list(datasets)
    counts = read_counts(root, names, storage)
    found = []
    versions: dict[str, str] = {}
    for name in names:
        folder = f"{base}/{name}"
        if not listing.call("stat", fs.isdir, folder):
            entries = listing.call("list", fs.ls, base, detail=False)
            available = sorted(posixpath.basename(e.rstrip("/")) for e in entries)
            raise ConfigError(
                f"dataset {name!r} is not a folder of data_path {root!r}; it holds {available}"
            )
        found_files = listing.call("list", fs.find, folder, detail=True)
        files = {k: v for k, v in found_files.items() if v.get("type") == "file"}
        rel_paths: list[str] = []
        sizes: list[int] = []
        for full in handler.select(sorted(files)):
            rel_paths.append(full[len(base) + 1 :])
            sizes.append(int(files[full].get("size") or 0))
            versions[rel_paths[-1]] = _version(files[full])
        if not rel_paths:
            raise EmptyDatasetError(
                f"dataset {name!r} ({folder}) holds no {handler.name} shard "
                f"(looked for files ending in {', '.join(handler.extensions)})"
            )
        known = np.array([counts.get(p, (-1, -1)) for p in rel_paths], dtype=np.int64)
        docs, tokens = known.reshape(-1, 2).T.copy()
        for i in np.flatnonzero(docs < 0).tolist():
            seen = filecounts.recall(root, rel_paths[i], sizes[i])
            if seen is not None:
                docs[i], tokens[i] = seen
        unknown = int((docs < 0).sum())
        if counts and unknown:
            logger.warning(
                "%d file(s) of dataset %r are missing from the counts metadata and will be "
                "counted; run `fmsdata index %s` to refresh it",
                unknown,
                name,
                root,
            )
        found.append(
            DatasetFiles(
                name=name,
                paths=tuple(rel_paths),
                sizes=np.array(sizes, dtype=np.int64),
                docs=docs,
                tokens=tokens,
            )
        )
    if not is_local(fs) and count:
        # Remote: count what is left from the formats' metadata now, all files at once
        # and in parallel, so no shard downloads a file only to count it.
        from fmsdata.data.metacount import count_catalog  # (imports the handlers' readers)

        if counts_dir is None:
            count_catalog(root, found, handler, listing, progress)
        else:
            _count_with_disk_cache(root, found, handler, listing, progress, counts_dir, versions)
    return Catalog(root=root, datasets=tuple(found))


def _version(entry: dict[str, Any]) -> str:
    """What a listing says of a file's version (its ETag, else its modification time)."""
    for field in ("ETag", "etag", "md5Hash", "mtime", "LastModified", "last_modified", "updated"):
        value = entry.get(field)
        if value is not None:
            return str(value).replace("\t", " ").replace("\n", " ")
    return ""


def _count_with_disk_cache(
    root: str,
    found: list[DatasetFiles],
    handler: FileHandler,
    listing: _Listing,
    progress: Callable[[int, int], None] | None,
    counts_dir: str,
    versions: dict[str, str],
) -> None:
    """``count_catalog`` with the on-disk counts cache: files it knows (same path, size
    and version) are not read; what was counted is written back."""
    from fmsdata.data.metacount import count_catalog

    cached = filecounts.load_disk(counts_dir, root)
    known = 0
    for ds in found:
        for i in np.flatnonzero(ds.docs < 0).tolist():
            hit = cached.get((ds.paths[i], int(ds.sizes[i]), versions[ds.paths[i]]))
            if hit is not None:
                ds.docs[i], ds.tokens[i] = hit
                filecounts.remember(root, ds.paths[i], int(ds.sizes[i]), *hit)
                known += 1
    unknown = sum(int((ds.docs < 0).sum()) for ds in found)
    if known:
        logger.info("%d file count(s) of %s read from the counts cache", known, root)
    if not unknown:
        return
    count_catalog(root, found, handler, listing, progress)
    keep = {
        (path, int(size), versions[path]): (int(d), int(t))
        for ds in found
        for path, size, d, t in zip(
            ds.paths, ds.sizes.tolist(), ds.docs.tolist(), ds.tokens.tolist()
        )
        if d >= 0
    }
    filecounts.save_disk(counts_dir, root, keep)
