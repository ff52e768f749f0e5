"""Which documents each fms-fsdp logical shard owns, and in which file order it visits them.

Facts of fms-fsdp ``mamba-new`` (``StreamingDocDataset.setup``), reproduced here:

- a dataset's files are every file under its folder (``os.walk``, any depth) whose
  extension contains ``arrow`` or ``parquet`` (the ``auto`` handler), as paths relative to
  the folder, sorted: directory listing order does not matter;
- with ``S`` files and ``L`` logical shards, logical shard ``k`` owns fragments
  ``k*S .. (k+1)*S - 1`` of the ``S*L`` fragments (fragment ``i`` is slice ``i % L`` of file
  ``i // L``); slice ``f`` of a file of ``n`` documents is documents
  ``n*f // L .. (n*f + n) // L - 1``; fragments of one file merge into one range;
- document counts come from ``<parent>/meta/*counts*.csv`` when the dataset's parent folder
  has one (column ``dataset/filename``, ``documents``), else from each file;
- the ranges are shuffled with Python's Mersenne Twister seeded ``seed + k`` (here a local
  ``random.Random``, the same draws as fms-fsdp's ``random.seed``; ``random.shuffle``).
"""

from __future__ import annotations

import csv
import os
import random
from dataclasses import dataclass

from fmsdata.errors import ConfigError

__all__ = ["ShardDocs", "dataset_name", "list_files", "logical_docs", "meta_counts"]


@dataclass(frozen=True)
class ShardDocs:
    """One logical shard's documents: ``ranges`` of ``(file, first doc, last doc)``
    (inclusive, possibly empty) in visiting order."""

    ranges: tuple[tuple[str, int, int], ...]

    @property
    def n_docs(self) -> int:
        return sum(last - first + 1 for _, first, last in self.ranges)


def dataset_name(folder: str) -> tuple[str, str]:
    """``(parent folder, last path component)``, trailing slashes ignored, as fms-fsdp
    names a dataset in its checkpoints."""
    parent, name = os.path.split(folder)
    while not name and parent not in ("", os.sep):
        parent, name = os.path.split(parent)
    return parent, name


def list_files(folder: str) -> list[str]:
    """The shard files of one dataset folder, relative and sorted."""
    if not os.path.isdir(folder):
        raise ConfigError(f"dataset folder {folder!r} does not exist")
    files = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            ext = os.path.splitext(name)[1]
            if "arrow" in ext or "parquet" in ext:
                files.append(os.path.join(root, name)[len(folder.rstrip(os.sep)) + 1 :])
    files.sort()
    return files


def meta_counts(folder: str) -> dict[str, int] | None:
    """Document counts from the first ``*counts*.csv`` in the parent's ``meta`` folder
    (keys relative to the dataset folder), or None when there is none."""
    parent, name = dataset_name(folder)
    meta = os.path.join(parent, "meta")
    if not os.path.exists(meta):
        return None
    found = [x for x in os.listdir(meta) if "counts" in x and "csv" in x]
    if not found:
        return None
    counts = {}
    with open(os.path.join(meta, found[0]), newline="") as f:
        for row in csv.DictReader(f):
            full = row["dataset/filename"]
            prefix = full.find("/" + name) + 1
            if prefix > 0:
                counts[full[prefix + len(name) + 1 :]] = int(row["documents"])
    return counts


def logical_docs(
    files: list[str], counts: dict[str, int], shard: int, n_shards: int, seed: int
) -> ShardDocs:
    """The documents logical shard ``shard`` of ``n_shards`` owns, shuffled by file."""
    n_files = len(files)
    ranges: dict[str, list[int]] = {}
    for i in range(shard * n_files, (shard + 1) * n_files):
        name, frag = files[i // n_shards], i % n_shards
        if name not in counts:
            raise ConfigError(f"no document count for {name!r} in the dataset's meta csv")
        n = counts[name]
        first, last = (n * frag) // n_shards, (n * frag + n) // n_shards - 1
        span = ranges.setdefault(name, [first, last])
        span[0], span[1] = min(span[0], first), max(span[1], last)
    order = [(name, lo, hi) for name, (lo, hi) in ranges.items()]
    random.Random(seed + shard).shuffle(order)
    return ShardDocs(tuple(order))
