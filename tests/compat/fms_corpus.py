"""Arrow shards for the fms-fsdp parity fixtures, rebuilt from a seed wherever tests run.

The oracle script (``make_fms_fsdp_fixtures.py``) runs fms-fsdp's own loader on these
shards and commits digests of its batches; the tests rebuild the same shards in
``tmp_path`` and compare fmsdata's ``order="fms-fsdp"`` batches with those digests. So the
corpus must be a pure function of its seed: numpy's ``default_rng`` only.

Layout, chosen to exercise what moves fms-fsdp's order: nested dataset names
(``lang=en/dataset=web``), a flat one (``code``), files in subfolders (listed by
``os.walk`` and sorted), a non-arrow file that is ignored, documents longer than
fms-fsdp's 1,024-token chunks, documents that already carry EOS/BOS at their edges,
documents shorter than its minimum length, and one EOS inside a document exactly at a
chunk boundary (fms-fsdp ends a document on the token value, not on its structure).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pyarrow as pa

__all__ = ["DATASETS", "batch_digest", "make_corpus"]

# dataset -> list of (relative file path, number of documents)
DATASETS: dict[str, list[tuple[str, int]]] = {
    "lang=en/dataset=web": [("part-000.arrow", 37), ("sub/part-001.arrow", 23)],
    "lang=de/dataset=wiki": [("a.arrow", 19)],
    "code": [("x/b.arrow", 11), ("a.arrow", 29), ("c.arrow", 5)],
}


def _doc(rng: np.random.Generator, index: int, special: tuple[int, ...]) -> np.ndarray:
    kind = rng.integers(0, 20)
    if kind == 0:
        n = int(rng.integers(1, 3))  # shorter than fms-fsdp's minimum once EOS is added
    elif kind < 3:
        n = int(rng.integers(900, 2600))  # several 1,024-token chunks
    else:
        n = int(rng.integers(3, 160))
    doc = rng.integers(10, 30000, size=n, dtype=np.uint32)
    if n > 2 and kind == 3:
        doc[-1] = special[0]  # EOS already present
    if n > 2 and kind == 4:
        doc[0] = special[1]  # BOS already present
    if n > 2 and kind == 5:
        doc[0], doc[-1] = special[1], special[0]
    if n > 1100 and index % 2 == 0:
        doc[1023] = special[0]  # an EOS value exactly where a 1,024-token chunk ends
    return doc


def make_corpus(root: str, seed: int = 0, special: tuple[int, ...] = (0, 1)) -> str:
    """Write the corpus under ``root`` and return ``root``.

    Args:
        root: An empty or missing folder.
        seed: Everything written is a function of it.
        special: ``(eos, bos)`` values planted at document edges.
    """
    rng = np.random.default_rng(seed)
    for dataset, files in DATASETS.items():
        for rel, n_docs in files:
            path = os.path.join(root, dataset, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            schema = pa.schema([("tokens", pa.uint32())])
            with pa.ipc.new_file(path, schema) as writer:
                for i in range(n_docs):
                    doc = _doc(rng, i, special)
                    writer.write_batch(pa.record_batch([pa.array(doc)], schema=schema))
        with open(os.path.join(root, dataset, "README.txt"), "w") as f:
            f.write("not a shard: fms-fsdp's auto handler skips it\n")
    return root


def batch_digest(batch: object) -> str:
    """The first 16 hex digits of SHA-256 over a batch's tensors (a tensor or a tuple),
    each as contiguous int32 bytes in order."""
    parts = batch if isinstance(batch, (tuple, list)) else (batch,)
    h = hashlib.sha256()
    for part in parts:
        h.update(np.ascontiguousarray(part.numpy().astype(np.int32)).tobytes())
    return h.hexdigest()[:16]


def loader_digests(
    values: dict, rank: int, world: int, steps: int, order: str | None = "fms-fsdp"
) -> list[str]:
    """``batch_digest`` of the first ``steps`` batches of fmsdata's fms-fsdp entry point for
    the ``train_config`` fields ``values`` on ``rank`` of ``world``."""
    from fmsdata.compat.fms_fsdp import get_data_loader

    it = iter(get_data_loader(values, rank, world, order=order))
    return [batch_digest(next(it)) for _ in range(steps)]
