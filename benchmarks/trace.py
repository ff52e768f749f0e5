"""Provenance speed: a step 10,000 global steps past a checkpoint, a document over 100,000
steps, and the cost of a per-step digest.

A generated root (two datasets of Arrow files, one record batch per document, ~700-token
documents, ``meta/counts.csv``), the issue's shape: 64 logical shards, ``seq_length``
4,096, 8 ranks of batch 8 (global batch 64), the default shuffle window. A checkpoint is
saved by the 8 ranks' loaders after ``--saved-at`` steps. Then, each in a fresh process
pinned to one core (the trace's own figures, cold numba cache excluded: one untimed run
first fills it):

- ``step``: ``Tracer(config, checkpoint).step(saved_at + 10,000)``, loading included;
- ``doc``: ``Tracer(config).document(...)`` up to step 100,000 for a document of the
  first file (one logical shard followed);
- the baseline, in the same process as ``step``: the loader delivering steps from the
  same checkpoint (one rank over all 64 shards, 8 batches a global step), per step: the
  trace's seconds are said as the steps the loader delivers in that time;
- ``digest``: ``batch_digest`` of a rank's batch (8 x 4,096), microseconds.

    python benchmarks/trace.py                 # the issue's figures
    python benchmarks/trace.py --quick         # 1,000 / 10,000 steps

Prints a table and writes ``benchmarks/results/trace.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from benchlib import write_results

HERE = os.path.dirname(os.path.abspath(__file__))
FILES, DOCS = 32, 400  # per dataset: ~9 M tokens each


def make_root(root: str) -> None:
    from fmsdata.data.indexing import index_root
    from fmsdata.handlers import ArrowDocHandler
    from fmsdata.handlers.arrow import write_arrow_docs

    if os.path.exists(os.path.join(root, "meta", "counts.csv")):
        return
    rng = np.random.default_rng(0)
    for name in ("web", "code"):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for f in range(FILES):
            lengths = np.maximum(1, rng.lognormal(np.log(700), 1.0, DOCS)).astype(np.int64)
            tokens = rng.integers(16, 50_000, int(lengths.sum()), dtype=np.uint16)
            docs = np.split(tokens, np.cumsum(lengths)[:-1])
            write_arrow_docs(os.path.join(root, name, f"part_{f:03d}.arrow"), docs, dtype=np.uint16)
    index_root(root, ArrowDocHandler(), workers=2)


def config(root: str) -> dict[str, Any]:
    return dict(
        data_path=root,
        datasets=["web", "code"],
        weights=[0.7, 0.3],
        seq_length=4096,
        batch_size=8,
        logical_shards=64,
        bos_token=0,
        eos_token=1,
        num_workers=0,
    )


def save_checkpoint(root: str, steps: int, path: str) -> None:
    """Eight ranks' loaders take ``steps`` steps and save a loader checkpoint at ``path``."""
    from fmsdata import build_dataloader
    from fmsdata.checkpoint import save_loader_state

    for rank in range(8):
        loader = build_dataloader(config(root), rank=rank, world_size=8)
        batches = iter(loader)
        for _ in range(steps):
            next(batches)
        save_loader_state(loader, path)


def child(args: argparse.Namespace) -> None:
    """One measurement in this fresh process, on one core; prints JSON."""
    import warnings

    import torch

    warnings.simplefilter("ignore")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    from fmsdata import build_dataloader
    from fmsdata.checkpoint import load_loader_state
    from fmsdata.trace import Tracer

    cfg = config(args.root)
    out: dict[str, Any] = {}
    if args.what == "step":
        start = time.perf_counter()
        tracer = Tracer(cfg, checkpoint=args.state)
        trace = tracer.step(tracer.checkpoint_step + args.ahead)
        out["seconds"] = time.perf_counter() - start
        out["rows"] = len(trace.rows)
        loader = build_dataloader(cfg, rank=0, world_size=1)
        load_loader_state(loader, args.state)
        batches = iter(loader)
        next(batches)  # the first batch pays the resume; the rate is of the steps after it
        start = time.perf_counter()
        for _ in range(8 * args.baseline_steps):
            next(batches)
        out["loader_step_seconds"] = (time.perf_counter() - start) / args.baseline_steps
    elif args.what == "doc":
        start = time.perf_counter()
        found = Tracer(cfg, world_size=8).document("web", 0, 0, until=args.until)
        out["seconds"] = time.perf_counter() - start
        out["seen"] = len(found.seen)
        out["shards"] = found.shards
    else:
        from fmsdata.util.digest import batch_digest

        ids = torch.randint(0, 50_000, (8, 4096), dtype=torch.int64)
        labels = torch.randint(0, 50_000, (8, 4096), dtype=torch.int64)
        batch_digest(ids, labels)
        start = time.perf_counter()
        for _ in range(200):
            batch_digest(ids, labels)
        out["microseconds"] = (time.perf_counter() - start) / 200 * 1e6
    print(json.dumps(out))


def measure(args: argparse.Namespace, what: str, **extra: Any) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", what, "--root", args.root]
    for key, value in extra.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ahead", type=int, default=10_000, help="steps past the checkpoint")
    parser.add_argument("--until", type=int, default=100_000, help="steps a document is sought in")
    parser.add_argument("--saved-at", type=int, default=20, help="steps before the checkpoint")
    parser.add_argument(
        "--baseline-steps", type=int, default=5, help="global steps the loader makes"
    )
    parser.add_argument("--quick", action="store_true", help="--ahead 1000 --until 10000")
    parser.add_argument("--scratch", default=None, help="where the root is generated (kept)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "trace.json"))
    parser.add_argument("--child", choices=["step", "doc", "digest"], help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.what = args.child
        child(args)
        return 0
    if args.quick:
        args.ahead, args.until = 1_000, 10_000
    scratch = args.scratch or tempfile.mkdtemp(prefix="fmsdata-trace-")
    args.root = os.path.join(scratch, "root")
    make_root(args.root)
    state = os.path.join(scratch, f"ckpt{args.saved_at}")
    if not os.path.exists(state):
        save_checkpoint(args.root, args.saved_at, state)
    common = {"state": state, "ahead": args.ahead, "baseline_steps": args.baseline_steps}
    measure(args, "step", **{**common, "ahead": 10, "baseline_steps": 1})  # fills the cache
    step = measure(args, "step", **common)
    doc = measure(args, "doc", until=args.until)
    digest = measure(args, "digest")
    per_step = step["loader_step_seconds"]
    results = {
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "shape": "64 logical shards, seq_length 4096, 8 ranks x batch 8, shuffle_window 160",
        "step": {
            "ahead": args.ahead,
            "seconds": step["seconds"],
            "target_seconds": 10.0,
            "loader_seconds_per_step": per_step,
            "loader_steps_in_that_time": step["seconds"] / per_step,
        },
        "doc": {
            "until": args.until,
            "seconds": doc["seconds"],
            "target_seconds": 60.0,
            "seen": doc["seen"],
            "shards": doc["shards"],
        },  # fmt: skip
        "digest_microseconds": digest["microseconds"],
    }
    print(f"{'measure':44} {'seconds':>9} {'target':>7}")
    print(f"{f'step {args.ahead:,} steps past a checkpoint':44} {step['seconds']:9.2f} {10:>7}")
    print(f"{f'document over {args.until:,} steps':44} {doc['seconds']:9.2f} {60:>7}")
    print(
        f"\nthe loader delivers a global step (64 x 4,096 tokens, one process) in {per_step:.2f} s:"
        f" the trace of {args.ahead:,} steps costs {step['seconds'] / per_step:.1f} of its steps"
    )
    print(f"digest of a rank's batch (8 x 4,096): {digest['microseconds']:.0f} us")
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
