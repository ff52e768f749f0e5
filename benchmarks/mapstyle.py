"""Map-style access (``get_dataset``): random-window read speed against a bare memmap read,
and the memory each copy of the dataset costs in spawned worker processes.

    python benchmarks/mapstyle.py [--tokens 50_000_000] [--copies 4]

A root of flat token files (uint16, EOS after every document) is written once; windows of
``--context`` tokens are read at random positions through ``get_dataset`` (flat files, and
the same tokens as Arrow shards, where EOS is inserted between documents) and straight off
``np.memmap`` of the same files. Then ``--copies`` processes are spawned, each unpickling
the dataset and reading ``--reads`` random windows; each reports its pickle size and the
growth of its private (anonymous) memory and resident set across the reads.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pickle
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from benchlib import write_results  # noqa: E402
from formats import write_arrow, write_flat  # noqa: E402

import fmsdata  # noqa: E402

EOS = 1


def _memory() -> dict[str, int]:
    """Private (anonymous and written) and resident bytes of this process."""
    fields = {}
    with open("/proc/self/smaps_rollup") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                fields[parts[0][:-1]] = int(parts[1]) * 1024
    return {"private": fields["Private_Clean"] + fields["Private_Dirty"], "rss": fields["Rss"]}


def _copy(payload: bytes, reads: int, seed: int, out: multiprocessing.Queue) -> None:
    dataset = pickle.loads(payload)
    dataset[0]  # opens the first file: the fixed cost
    before = _memory()
    rng = np.random.default_rng(seed)
    for i in rng.integers(0, len(dataset), reads):
        dataset[int(i)]
    after = _memory()
    out.put({k: after[k] - before[k] for k in after})


def _windows_per_second(read, n: int, count: int, seed: int = 0) -> float:
    order = np.random.default_rng(seed).integers(0, n, count)
    start = time.perf_counter()
    for i in order:
        read(int(i))
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=50_000_000)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--reads", type=int, default=5000)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "mapstyle.json"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="fmsdata-mapstyle-")
    os.environ.setdefault("FMSDATA_CACHE", os.path.join(work, "cache"))
    rng = np.random.default_rng(0)
    per_file = args.tokens // args.files
    files = []
    for _ in range(args.files):
        lengths = np.maximum(1, rng.lognormal(np.log(700), 1.0, per_file // 700)).astype(int)
        tokens = rng.integers(16, 50_000, int(lengths.sum()), dtype=np.uint16)
        files.append(np.split(tokens, np.cumsum(lengths)[:-1]))
    write_flat(os.path.join(work, "flat"), {"web": files}, EOS)
    write_arrow(os.path.join(work, "arrow"), {"web": files})
    results: dict[str, object] = {"context_length": args.context}

    flat = fmsdata.get_dataset(
        os.path.join(work, "flat"), args.context, eos_token=EOS, token_dtype="uint16"
    )
    plain = fmsdata.get_dataset(
        os.path.join(work, "flat"),
        args.context,
        eos_token=EOS,
        token_dtype="uint16",
        create_doc_ids=False,
    )
    arrow = fmsdata.get_dataset(os.path.join(work, "arrow"), args.context, eos_token=EOS)
    maps = [
        np.memmap(os.path.join(work, "flat", "web", p), np.uint16, mode="r")
        for p in sorted(os.listdir(os.path.join(work, "flat", "web")))
        if p.endswith(".npy")
    ]
    offsets = np.concatenate([[0], np.cumsum([len(m) for m in maps])])

    def bare(i: int) -> np.ndarray:  # the same window off the memmaps, nothing else
        start = i * args.context
        f = int(np.searchsorted(offsets, start, "right") - 1)
        piece = maps[f][start - offsets[f] : start - offsets[f] + args.context]
        if len(piece) < args.context:
            piece = np.concatenate([piece, maps[f + 1][: args.context - len(piece)]])
        return torch_tensor(piece)

    count = 20_000
    rates = {
        "bare memmap": _windows_per_second(bare, len(flat), count),
        "get_dataset flat": _windows_per_second(flat.__getitem__, len(flat), count),
        "flat, no doc ids": _windows_per_second(plain.__getitem__, len(plain), count),
        "get_dataset arrow": _windows_per_second(arrow.__getitem__, len(arrow), count),
    }
    print(f"{flat.num_tokens():,} tokens, {len(flat):,} windows of {args.context}")
    for name, rate in rates.items():
        print(f"  {name:>18}: {rate:10,.0f} windows/s  ({rate / rates['bare memmap']:.2f}x bare)")
    results["windows_per_second"] = rates

    payload = pickle.dumps(flat)
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue = context.Queue()
    procs = [
        context.Process(target=_copy, args=(payload, args.reads, k, queue))
        for k in range(args.copies)
    ]
    for p in procs:
        p.start()
    growth = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    print(f"pickled dataset: {len(payload):,} bytes ({args.files} files)")
    for k, g in enumerate(growth):
        print(
            f"  copy {k}: private memory +{g['private'] / 2**20:.1f} MiB, "
            f"resident +{g['rss'] / 2**20:.1f} MiB over {args.reads:,} random windows"
        )
    results.update(pickle_bytes=len(payload), copies=growth, reads=args.reads)
    write_results(args.out, results)


def torch_tensor(array: np.ndarray):
    import torch

    return torch.from_numpy(array.astype(np.int64))


if __name__ == "__main__":
    main()
