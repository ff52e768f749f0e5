"""Generated token corpora for tests, benchmarks and the examples (no downloads).

Token values are consecutive integers starting at ``first_token``, one per stored token
of the whole corpus, so every token says where it came from: coverage and duplicates can
be checked exactly by counting values.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import numpy as np

from fmsdata.handlers.arrow import write_arrow_docs
from fmsdata.util.urls import local_path

__all__ = ["CorpusInfo", "write_corpus", "document_lengths"]


@dataclasses.dataclass(frozen=True)
class CorpusInfo:
    """What was written.

    Attributes:
        root: The data root.
        ranges: ``{dataset: (first token value, end)}``.
        documents: ``{dataset: document count}``.
        files: ``{relative path: (first token value of each document, its length)}``.
    """

    root: str
    ranges: dict[str, tuple[int, int]]
    documents: dict[str, int]
    files: dict[str, tuple[np.ndarray, np.ndarray]]

    def tokens(self, name: str) -> int:
        first, end = self.ranges[name]
        return end - first

    def dataset_of(self, values: np.ndarray) -> np.ndarray:
        """Index (in ``ranges`` order) of the dataset each token value belongs to, -1 if none."""
        out = np.full(values.shape, -1, dtype=np.int64)
        for i, (first, end) in enumerate(self.ranges.values()):
            out[(values >= first) & (values < end)] = i
        return out


def document_lengths(
    rng: np.random.Generator, n: int, mean: float, spread: float = 1.0
) -> np.ndarray:
    """Log-normally distributed document lengths (at least 1) with roughly the given mean."""
    sigma = spread
    mu = np.log(mean) - sigma**2 / 2
    return np.maximum(1, rng.lognormal(mu, sigma, size=n)).astype(np.int64)


def write_corpus(
    root: str | os.PathLike[str],
    files: Mapping[str, int],
    docs_per_file: int | tuple[int, int] = 20,
    mean_length: float = 100,
    spread: float = 1.0,
    seed: int = 0,
    first_token: int = 16,
    nested: bool = False,
    col_name: str = "tokens",
    dtype: type = np.uint32,
) -> CorpusInfo:
    """Write Arrow shards (one record batch per document) under ``root/<dataset>/``.

    Args:
        root: Data root to create.
        files: Number of shard files per dataset name.
        docs_per_file: Documents per file, or a ``(low, high)`` range drawn per file.
        mean_length, spread: Log-normal document length parameters.
        seed: Generator seed.
        first_token: Smallest token value (room below for special tokens).
        nested: Put every other file in a sub-folder.
        col_name, dtype: Token column name and type.
    """
    rng = np.random.default_rng(seed)
    root = local_path(root, "write_corpus(root)")
    next_token = first_token
    ranges: dict[str, tuple[int, int]] = {}
    documents: dict[str, int] = {}
    written: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, n_files in files.items():
        start = next_token
        count = 0
        for f in range(n_files):
            if isinstance(docs_per_file, tuple):
                n_docs = int(rng.integers(docs_per_file[0], docs_per_file[1] + 1))
            else:
                n_docs = docs_per_file
            lengths = document_lengths(rng, n_docs, mean_length, spread)
            firsts = next_token + np.cumsum(lengths) - lengths
            docs = [np.arange(a, a + n, dtype=np.int64) for a, n in zip(firsts, lengths)]
            next_token += int(lengths.sum())
            sub = os.path.join(name, "part") if nested and f % 2 else name
            os.makedirs(os.path.join(root, sub), exist_ok=True)
            relative = f"{sub}/shard_{f:05d}.arrow".replace(os.sep, "/")
            write_arrow_docs(os.path.join(root, relative), docs, col_name, dtype)
            written[relative] = (firsts, lengths)
            count += n_docs
        ranges[name] = (start, next_token)
        documents[name] = count
    return CorpusInfo(root=root, ranges=ranges, documents=documents, files=written)
