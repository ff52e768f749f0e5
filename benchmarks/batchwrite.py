"""The final-batch write alone: fmsdata's kernel against the same loop with ordinary stores.

A worker turns its int32 rows into the int64 ``input_ids`` and ``labels`` of the batch ring
(``fmsdata.transport.batchwrite._shift``, non-temporal stores, one fence an item). The baseline,
measured in the same run on the same arrays, is that loop compiled with ordinary stores
(what fmsdata did before 5a16b89); numpy's ``copyto`` of the two shifted views is shown
beside it. Each case writes batches of 8 rows of 4,096 tokens in turn into a ring of
``slots`` batches (about 35 MiB: in process; 128 MiB: one worker, ``prefetch_factor`` 2),
from an int32 row buffer of one batch (128 KiB, stays in the cache) or of an item (64
batches, 8 MiB, as a worker holds them). Prints a table of ns a token and the ratio to the
baseline, writes ``benchmarks/results/batchwrite.json`` and a chart (needs matplotlib).

    python benchmarks/batchwrite.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import pyplot, write_results  # noqa: E402

from fmsdata.stages.outputs import IGNORE_INDEX  # noqa: E402
from fmsdata.transport import batchwrite  # noqa: E402

SEQ, BATCH = 4096, 8
CASES = {  # name: (ring slots, rows in the int32 buffer)
    "ring 35 MiB, rows of a batch": (70, BATCH),
    "ring 35 MiB, rows of an item": (70, 64 * BATCH),
    "ring 128 MiB, rows of a batch": (256, BATCH),
    "ring 128 MiB, rows of an item": (256, 64 * BATCH),
}


def _ordinary_shift() -> Any:
    """``_shift``'s loop with ordinary stores (the baseline)."""
    import numba

    @numba.njit(nogil=True)
    def shift(tokens, content, rows, inputs, labels, ignore):  # type: ignore[no-untyped-def]
        seq = inputs.shape[1]
        for i in range(tokens.shape[0]):
            r = rows[i]
            keep = min(max(content[i] - 1, 0), seq)
            for j in range(seq):
                inputs[r, j] = tokens[i, j]
            for j in range(keep):
                labels[r, j] = tokens[i, j + 1]
            for j in range(keep, seq):
                labels[r, j] = ignore

    return shift


def _fmsdata_shift(tokens, content, rows, inputs, labels, ignore):  # type: ignore[no-untyped-def]
    batchwrite._shift(tokens, content, rows, inputs, labels, ignore, 0)


def _numpy_shift(tokens, content, rows, inputs, labels, ignore):  # type: ignore[no-untyped-def]
    np.copyto(inputs, tokens[:, :-1], casting="unsafe")
    np.copyto(labels, tokens[:, 1:], casting="unsafe")


def time_case(write: Any, slots: int, buffer_rows: int, batches: int) -> float:
    """ns a token of writing ``batches`` batches in turn, after one pass over the ring."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50_000, (buffer_rows, SEQ + 1), dtype=np.int32)
    ring = np.zeros((slots, 2, BATCH, SEQ), dtype=np.int64)
    content = np.full(BATCH, SEQ + 1, dtype=np.int64)
    rows = np.arange(BATCH, dtype=np.int64)
    per_buffer = buffer_rows // BATCH

    def run(n: int) -> None:
        for k in range(n):
            at = (k % per_buffer) * BATCH
            slot = ring[k % slots]
            write(tokens[at : at + BATCH], content, rows, slot[0], slot[1], IGNORE_INDEX)
        batchwrite._fence()

    run(slots)  # pages in, compiled
    start = time.perf_counter()
    run(batches)
    return (time.perf_counter() - start) / (batches * BATCH * SEQ) * 1e9


def chart(results: dict[str, Any], path: str) -> None:
    plt = pyplot(path)
    if plt is None:
        return
    names = list(results["cases"])
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh(names, [results["cases"][n]["ratio"] for n in names])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("time / ordinary stores (lower is faster)")
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2560)
    parser.add_argument("--repeat", type=int, default=3, help="alternated runs; medians kept")
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.join(here, "results", "batchwrite.json"))
    parser.add_argument("--chart", default=os.path.join(here, "batchwrite.png"))
    args = parser.parse_args()
    writers = {"ordinary": _ordinary_shift(), "fmsdata": _fmsdata_shift, "numpy": _numpy_shift}
    results: dict[str, Any] = {"batch": BATCH, "seq": SEQ, "cases": {}}
    print(f"{'case':32s} {'ordinary':>9s} {'fmsdata':>9s} {'numpy':>9s} {'ratio':>6s}  (ns/token)")
    for name, (slots, buffer_rows) in CASES.items():
        times: dict[str, list[float]] = {key: [] for key in writers}
        for _ in range(args.repeat):
            for key, write in writers.items():
                times[key].append(time_case(write, slots, buffer_rows, args.batches))
        row = {key: statistics.median(values) for key, values in times.items()}
        row["ratio"] = row["fmsdata"] / row["ordinary"]
        results["cases"][name] = row
        print(
            f"{name:32s} {row['ordinary']:9.2f} {row['fmsdata']:9.2f} {row['numpy']:9.2f} "
            f"{row['ratio']:6.2f}"
        )
    write_results(args.out, results)
    chart(results, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
