"""Pieces the benchmark scripts share: generated documents and the JSON results file."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np


def generated_documents(files: int, docs: int, seed: int = 0) -> dict[str, list]:
    """Two datasets (``web``, ``code``) of ``files`` files of ``docs`` uint16 documents each,
    log-normal lengths around 700 tokens."""
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {}
    for name in ("web", "code"):
        out[name] = []
        for _ in range(files):
            lengths = np.maximum(1, rng.lognormal(np.log(700), 1.0, docs)).astype(np.int64)
            tokens = rng.integers(16, 50_000, int(lengths.sum()), dtype=np.uint16)
            out[name].append(np.split(tokens, np.cumsum(lengths)[:-1]))
    return out


def pyplot(path: str) -> Any:
    """matplotlib's pyplot (drawing to files, no display), or None after saying that no
    chart is written to ``path`` (matplotlib is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no chart written to {path}")
        return None
    return plt


def write_results(path: str, results: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(results, handle, indent=2)
    print(f"\nwrote {path}")
