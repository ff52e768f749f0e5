"""The files of a root as one token stream: their order and cumulative token offsets.

The stream is every document of every file, in file order, each followed by the EOS
unless the format stores it (flat token files, ``.pbin``). Building it needs each file's
stream length: from ``meta/*counts*.csv`` where the root has one (no file opened), else
by opening each file once; the lengths are then written to
``<cache_dir>/mapstyle/<key>.npy`` (keyed by the root, its file list and sizes and the
reading options), so later datasets over the same root, in any process, open nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import posixpath

import numpy as np

from fmsdata.catalog import discover, read_counts
from fmsdata.errors import EmptyDatasetError
from fmsdata.handlers.base import FileHandler
from fmsdata.handlers.npy_header import load_npy
from fmsdata.mapstyle.source import RootSpec
from fmsdata.remote.cache import FileSource
from fmsdata.remote.storage import Storage

__all__ = ["StreamFiles", "list_stream_files", "EOS_ENDINGS"]

logger = logging.getLogger(__name__)

# Files whose documents carry their own EOS: flat token streams and Modalities .pbin.
FLAT_ENDINGS = (".npy", ".bin", ".ds")
EOS_ENDINGS = (*FLAT_ENDINGS, ".pbin")


@dataclasses.dataclass(frozen=True)
class StreamFiles:
    """The files of the stream, small enough to pickle to every worker.

    Attributes:
        paths: File paths relative to the root, in stream order.
        add_eos: Per file, whether an EOS follows each stored document.
        offsets: int64 ``[n_files + 1]``: where each file's tokens start in the stream.
        docs: int64 ``[n_files]``: documents per file.
        sizes: int64 ``[n_files]``: byte size of each file as listed (a file whose size
            differs when a process opens it has changed since: an error, not stale data).
        direct: Per file, whether it is a flat token file whose stream is the file itself
            (read by a direct memory map, see ``windows``).
    """

    paths: tuple[str, ...]
    add_eos: np.ndarray
    offsets: np.ndarray
    docs: np.ndarray
    sizes: np.ndarray
    direct: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])


def _listing(spec: RootSpec, handler: FileHandler, storage: Storage) -> tuple[list[str], list]:
    if spec.prefix is not None:
        fs, base = storage.filesystem(spec.root)
        found = fs.find(base, maxdepth=1, detail=True)
        names = sorted(
            posixpath.basename(p)
            for p, e in found.items()
            if e["type"] == "file"
            and posixpath.basename(p).startswith(spec.prefix)
            and p.endswith(spec.suffix or "")
        )
        if not names:
            raise EmptyDatasetError(
                f"{spec.root}: no file {spec.prefix}*{spec.suffix} (tatm tokenized_info)"
            )
        return names, [int(found[f"{base}/{n}"].get("size") or 0) for n in names]
    catalog = discover(spec.root, spec.datasets, handler, storage)
    paths = [p for ds in catalog.datasets for p in ds.paths]
    sizes = [int(s) for ds in catalog.datasets for s in ds.sizes]
    return paths, sizes


def _ends_with_eos(path: str, spec: RootSpec) -> bool:
    if spec.ends_with_eos is not None:
        return spec.ends_with_eos
    if spec.file_type in ("npy", "pbin"):
        return True
    return spec.file_type == "auto" and path.endswith(EOS_ENDINGS)


def list_stream_files(
    spec: RootSpec,
    handler: FileHandler,
    storage: Storage,
    source: FileSource,
    cache_dir: str,
) -> StreamFiles:
    """List the root's files and find each one's stream length (see the module doc)."""
    paths, sizes = _listing(spec, handler, storage)
    add_eos = np.array([not _ends_with_eos(p, spec) for p in paths], dtype=bool)
    key = hashlib.blake2b(digest_size=16)
    for part in (spec.root, repr(sorted(handler.describe().items())), add_eos.tobytes()):
        key.update(str(part).encode() + b"\0")
    for path, size in zip(paths, sizes):
        key.update(f"{path}\0{size}\0".encode())
    cache = os.path.join(cache_dir, "mapstyle", key.hexdigest() + ".npy")
    if os.path.exists(cache):
        counts = load_npy(cache)
    else:
        counts = _count(spec, paths, handler, storage, source)
        _store(cache, counts)
    docs, tokens = counts[0], counts[1]
    lengths = tokens + np.where(add_eos, docs, 0)
    offsets = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    direct = (
        np.array(
            [spec.file_type in ("npy", "auto") and p.endswith(FLAT_ENDINGS) for p in paths], bool
        )
        & ~add_eos
    )
    return StreamFiles(
        tuple(paths), add_eos, offsets, docs.astype(np.int64), np.array(sizes, np.int64), direct
    )


def _count(
    spec: RootSpec, paths: list[str], handler: FileHandler, storage: Storage, source: FileSource
) -> np.ndarray:
    """``[2, n_files]`` documents and stored tokens per file."""
    known = read_counts(spec.root, list(spec.datasets or ()), storage) if spec.datasets else {}
    counts = np.zeros((2, len(paths)), dtype=np.int64)
    opened = 0
    for f, path in enumerate(paths):
        if path in known:
            counts[:, f] = known[path]
            continue
        try:
            counts[:, f] = handler.count(source.local(path))
        finally:
            source.release(path)
        opened += 1
    if opened:
        logger.info("opened %d file(s) of %s to count their tokens", opened, spec.root)
    return counts


def _store(cache: str, counts: np.ndarray) -> None:
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        partial = f"{cache}.tmp{os.getpid()}"
        with open(partial, "wb") as out:
            np.save(out, counts, allow_pickle=False)
        os.replace(partial, cache)
    except OSError as err:  # a read-only cache only costs a recount next time
        logger.info("could not cache the token counts of the root: %s", err)
