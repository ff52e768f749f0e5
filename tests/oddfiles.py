"""Datasets with odd files (issue 46), written as a user's tokenize job would leave them:
every token value written once (``FIRST_TOKEN`` upwards), so a document is known by its
tokens."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
from support import FIRST_TOKEN

from fmsdata.data.synthetic import CorpusInfo
from fmsdata.handlers.arrow import write_arrow_docs

MIN = 4  # min_length of every test here
EOS = 2


@dataclasses.dataclass(frozen=True)
class Layout:
    """What was written for dataset ``ds``: each file's document lengths."""

    root: str
    files: tuple[tuple[int, ...], ...]

    @property
    def kept(self) -> set[tuple[str, int]]:
        """(file path, document) of every document at least ``MIN`` tokens long."""
        return {
            (path, d)
            for path, lengths in zip(self.paths, self.files)
            for d, n in enumerate(lengths)
            if n >= MIN
        }

    @property
    def paths(self) -> list[str]:
        return [f"ds/f{f:02d}.arrow" for f in range(len(self.files))]


def write_layout(root: str, files: list[list[int]], other: bool = True) -> Layout:
    """Dataset ``ds`` with one file per entry of ``files`` (document lengths, token values
    counting up), and beside it, with ``other``, a plain dataset ``other``."""
    token = FIRST_TOKEN
    os.makedirs(os.path.join(root, "ds"))
    for f, lengths in enumerate(files):
        docs = []
        for n in lengths:
            docs.append(np.arange(token, token + n))
            token += n
        write_arrow_docs(os.path.join(root, "ds", f"f{f:02d}.arrow"), docs)
    if other:
        os.makedirs(os.path.join(root, "other"))
        for f in range(2):
            docs = [np.arange(token + 30 * d, token + 30 * d + 30) for d in range(20)]
            token += 600
            write_arrow_docs(os.path.join(root, "other", f"o{f}.arrow"), docs)
    return Layout(root, tuple(tuple(lengths) for lengths in files))


def info_of(layout: Layout) -> CorpusInfo:
    return CorpusInfo(root=layout.root, ranges={"ds": (0, 0)}, documents={}, files={})


def loader_config(layout: Layout, n_shards: int, **overrides: Any) -> dict[str, Any]:
    """A loader over ``ds`` and ``other``, one line per shard a step, ``min_length=MIN``."""
    config = dict(
        data_path=layout.root,
        datasets=["ds", "other"],
        weights=[1.0, 1.0],
        seq_length=16,
        batch_size=n_shards,
        logical_shards=n_shards,
        shuffle_window=4,
        eos_token=EOS,
        min_length=MIN,
        seed=3,
        num_workers=0,
    )
    config.update(overrides)
    return config
