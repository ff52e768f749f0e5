"""The files of a root as one token stream: their order and cumulative token offsets.

The stream is every document of every file, in file order, each followed by the EOS
unless the root's metadata, the caller (``documents_end_with_eos``) or the format (flat
token files, ``.pbin``) says the stored documents end with it. Building it needs each
file's stream length: from ``meta/*counts*.csv`` where the root has one (no file opened),
else by opening each file once; the lengths are then written to
``<cache_dir>/mapstyle/<key>.npy`` (keyed by the root, its file list and sizes and the
reading options), so later datasets over the same root, in any process, open nothing.

Where an EOS is added, only the documents can tell that they already end with one
(Megatron data written with ``--append-eod``, Arrow another tool wrote with its EOS), and
a doubled EOS is silent in every window. So a file an EOS is added to has a few of its
documents' ends sampled (``fmsdata.data.delimiters.sample_edges``) each time a process first
opens it, when counting it and before reading a window from it, and most of them ending
with the EOS is refused (``check_stored_eos``), unless the caller said
``documents_end_with_eos=False``. The cache key holds whether files are checked, so a
count cached unchecked never spares a checked dataset its check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import posixpath
from typing import Any

import numpy as np

from fmsdata.data.catalog import discover, read_counts
from fmsdata.data.delimiters import most_carry, sample_edges
from fmsdata.errors import ConfigError, EmptyDatasetError
from fmsdata.handlers.base import FileHandler
from fmsdata.handlers.npy_header import load_npy
from fmsdata.mapstyle.source import RootSpec
from fmsdata.remote.cache import FileSource
from fmsdata.remote.storage import Storage

__all__ = ["StreamFiles", "list_stream_files", "check_stored_eos", "EOS_ENDINGS"]

logger = logging.getLogger(__name__)

# Files whose documents carry their own EOS: flat token streams and Modalities .pbin.
FLAT_ENDINGS = (".npy", ".bin", ".ds")
EOS_ENDINGS = (*FLAT_ENDINGS, ".pbin")


@dataclasses.dataclass(frozen=True)
class StreamFiles:
    """The files of the stream, small enough to pickle to every worker.

    Attributes:
        root: The root the paths are relative to (for messages).
        paths: File paths relative to the root, in stream order.
        add_eos: Per file, whether an EOS follows each stored document.
        check_eos: Per file, whether its sampled documents are checked for a stored EOS
            when a process opens it (``check_stored_eos``): where an EOS is added, unless
            the caller said ``documents_end_with_eos=False``.
        offsets: int64 ``[n_files + 1]``: where each file's tokens start in the stream.
        docs: int64 ``[n_files]``: documents per file.
        sizes: int64 ``[n_files]``: byte size of each file as listed (a file whose size
            differs when a process opens it has changed since: an error, not stale data).
        direct: Per file, whether it is a flat token file whose stream is the file itself
            (read by a direct memory map, see ``windows``).
    """

    root: str
    paths: tuple[str, ...]
    add_eos: np.ndarray
    check_eos: np.ndarray
    offsets: np.ndarray
    docs: np.ndarray
    sizes: np.ndarray
    direct: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def location(self, f: int) -> str:
        """File ``f`` as messages name it: its path under the root."""
        return _name(self.root, self.paths[f])


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
    check_eos = add_eos & spec.check_stored_eos
    key = hashlib.blake2b(digest_size=16)
    describe = repr(sorted(handler.describe().items()))
    for part in (spec.root, describe, add_eos.tobytes(), check_eos.tobytes(), spec.eos_token):
        key.update(str(part).encode() + b"\0")
    for path, size in zip(paths, sizes):
        key.update(f"{path}\0{size}\0".encode())
    cache = os.path.join(cache_dir, "mapstyle", key.hexdigest() + ".npy")
    if os.path.exists(cache):
        counts = load_npy(cache)
    else:
        counts = _count(spec, paths, check_eos, handler, storage, source)
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
        root=spec.root,
        paths=tuple(paths),
        add_eos=add_eos,
        check_eos=check_eos,
        offsets=offsets,
        docs=docs.astype(np.int64),
        sizes=np.array(sizes, np.int64),
        direct=direct,
    )


def check_stored_eos(handler: FileHandler, reader: Any, path: str, eos: int) -> None:
    """Refuse to add ``eos`` after the documents of a file most of whose sampled
    documents already end with it (the sample and the rule of ``fmsdata.data.delimiters``).

    Args:
        handler, reader: The file's handler and its open reader.
        path: The file, for the message.
        eos: The token the dataset adds after every document of the file.

    Raises:
        ConfigError: Naming the file, the token, how many sampled documents end with it
            and the fix.
    """
    _, last = sample_edges(handler, reader)
    found = most_carry(last, eos)
    if found:
        raise ConfigError(
            f"{path}: {found} of {len(last)} sampled documents already end with "
            f"eos_token={eos}, and get_dataset adds eos_token after every document of this "
            "file (neither the root's metadata nor its format says its documents end with "
            "it): each would end with it twice. Pass documents_end_with_eos=True to keep the "
            "stored ones and add none (documents_end_with_eos=False adds one anyway)"
        )


def _count(
    spec: RootSpec,
    paths: list[str],
    check_eos: np.ndarray,
    handler: FileHandler,
    storage: Storage,
    source: FileSource,
) -> np.ndarray:
    """``[2, n_files]`` documents and stored tokens per file; a file opened to count is
    checked for a stored EOS where ``check_eos`` says."""
    known = read_counts(spec.root, list(spec.datasets or ()), storage) if spec.datasets else {}
    counts = np.zeros((2, len(paths)), dtype=np.int64)
    opened = 0
    for f, path in enumerate(paths):
        if path in known:
            counts[:, f] = known[path]
            continue
        try:  # one open both counts the file and checks it
            reader = handler.open(source.local(path))
            try:
                if check_eos[f]:
                    assert spec.eos_token is not None  # get_dataset requires one
                    check_stored_eos(handler, reader, _name(spec.root, path), spec.eos_token)
                n = handler.num_docs(reader)
                lengths = handler.doc_lengths(reader, np.arange(n, dtype=np.int64))
                counts[:, f] = n, int(np.sum(lengths))
            finally:
                handler.close(reader)
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


def _name(root: str, path: str) -> str:
    """A file of the root as messages name it."""
    return posixpath.join(root.rstrip("/"), path) if root else path
