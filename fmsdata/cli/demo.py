"""``fmsdata demo``: the whole loader on a generated corpus, with no downloads.

Writes a small two-dataset corpus, indexes it, streams batches with two workers, saves
the state mid-run, resumes it in a fresh loader and checks the continuation is exact.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from fmsdata.handlers import ArrowDocHandler
from fmsdata.indexing import index_root
from fmsdata.loader import build_dataloader
from fmsdata.statefile import load_state, save_state
from fmsdata.synthetic import write_corpus


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="run the loader end to end on a generated example corpus",
        description=(
            "Generate a small corpus (two datasets of Arrow shards), index it, stream "
            "batches, save the loader state, resume it and verify the batches match."
        ),
    )
    parser.add_argument("--dir", help="where to write the corpus (default: a temporary folder)")
    parser.add_argument("--batches", type=int, default=400, help="batches to stream")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    root = args.dir or tempfile.mkdtemp(prefix="fmsdata-demo-")
    os.makedirs(root, exist_ok=True)
    print(f"corpus: {root}")
    info = write_corpus(root, {"web": 16, "code": 8}, docs_per_file=(200, 400), mean_length=600)
    index_root(root, ArrowDocHandler())
    for name in info.ranges:
        print(f"  {name}: {info.documents[name]:,} documents, {info.tokens(name):,} tokens")

    config = dict(
        data_path=root,
        datasets=["web", "code"],
        weights=[0.7, 0.3],
        seq_length=2048,
        batch_size=8,
        logical_shards=16,
        shuffle_window=64,
        bos_token=1,
        eos_token=2,
        num_workers=args.workers,
        return_position_ids=True,
    )
    loader = build_dataloader(config)
    start = time.perf_counter()
    iterator = iter(loader)
    batches = [next(iterator)]
    first = time.perf_counter() - start
    warm = args.batches // 2
    for i in range(args.batches - 1):
        if i == warm:
            start = time.perf_counter()
        batches.append(next(iterator))
    elapsed = time.perf_counter() - start
    tokens = sum(b["input_ids"].numel() for b in batches[warm + 1 :])
    values = torch.cat([b["input_ids"].ravel() for b in batches]).numpy()
    shares = {
        name: float(((values >= lo) & (values < hi)).mean())
        for name, (lo, hi) in info.ranges.items()
    }
    print(
        f"streamed {len(batches)} batches of {tuple(batches[0]['input_ids'].shape)}: first after "
        f"{first * 1e3:.0f} ms, then {tokens / elapsed / 1e6:.1f} M tokens/s (second half)"
    )
    print(
        "token shares: "
        + ", ".join(f"{k} {v:.3f}" for k, v in shares.items())
        + " (weights 0.7 / 0.3)"
    )

    half = args.batches // 2
    head = build_dataloader(config)
    for _, _ in zip(range(half), head):
        pass
    state_path = os.path.join(root, "loader_state.fms")
    save_state(state_path, head.snapshot())
    resumed = build_dataloader(config)
    resumed.load_state_dict(load_state(state_path))
    rest = [b for _, b in zip(range(args.batches - half), resumed)]
    exact = all(torch.equal(a[k], b[k]) for a, b in zip(batches[half:], rest) for k in a)
    print(
        f"state after {half} batches: {os.path.getsize(state_path) / 1024:.1f} KiB; "
        f"resumed run {'matches' if exact else 'DIFFERS FROM'} the uninterrupted one"
    )
    return 0 if exact else 1
