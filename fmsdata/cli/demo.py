"""``fmsdata demo``: raw text to training batches, end to end, with nothing downloaded.

The corpus is real English available on every Python install: the standard library's
docstrings, written as JSON lines. They are tokenized with the BPE tokenizer bundled with
fmsdata (trained on the same docstrings) into Arrow shards, indexed, and streamed with
DataLoader workers; the demo prints decoded samples and throughput, then saves the loader
state mid-run, resumes it in a fresh loader and checks the continuation is exact.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from fmsdata.handlers import ArrowDocHandler
from fmsdata.handlers.text import TextTokenizer
from fmsdata.indexing import index_root
from fmsdata.loader import build_dataloader
from fmsdata.statefile import load_state, save_state
from fmsdata.textcorpus import bundled_tokenizer_path, stdlib_docstrings
from fmsdata.tokenize import TokenizeSpec, run_tokenize

__all__ = ["add_parser", "run"]

RAW_FILES = 4


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="tokenize the stdlib's docstrings and stream them: the whole path, end to end",
        description=(
            "Write the standard library's docstrings as JSONL, tokenize them with the "
            "bundled BPE tokenizer into Arrow shards, index them, stream batches (decoded "
            "samples, throughput), save the loader state, resume it and verify the batches "
            "match."
        ),
    )
    parser.add_argument("--dir", help="where to write (default: a temporary folder)")
    parser.add_argument("--batches", type=int, default=200, help="batches to stream")
    parser.add_argument("--workers", type=int, default=2, help="tokenizer and loader workers")
    parser.set_defaults(run=run)


def write_raw(folder: str) -> tuple[int, int]:
    """The docstrings as ``RAW_FILES`` JSONL files; returns (documents, characters)."""
    os.makedirs(folder, exist_ok=True)
    texts = list(stdlib_docstrings())
    for k in range(RAW_FILES):
        with open(os.path.join(folder, f"stdlib-{k}.jsonl"), "w", encoding="utf-8") as out:
            for text in texts[k::RAW_FILES]:
                out.write(json.dumps({"text": text}) + "\n")
    return len(texts), sum(len(t) for t in texts)


def run(args: argparse.Namespace) -> int:
    work = args.dir or tempfile.mkdtemp(prefix="fmsdata-demo-")
    raw, root = os.path.join(work, "raw"), os.path.join(work, "tokens")
    tokenizer = bundled_tokenizer_path()
    docs, chars = write_raw(raw)
    print(f"1. corpus: {docs:,} stdlib docstrings ({chars / 1e6:.1f} M characters) in {raw}")

    start = time.perf_counter()
    spec = TokenizeSpec(root, "stdlib", tokenizer, shard_bytes=200_000)
    result = run_tokenize(spec, [raw], workers=args.workers)
    seconds = time.perf_counter() - start
    print(
        f"2. tokenized into {result.units} Arrow shards in {root}/stdlib: "
        f"{result.documents:,} documents, {result.tokens:,} tokens in {seconds:.1f} s "
        f"({args.workers} worker process(es), start-up included)"
    )
    target, rows = index_root(root, ArrowDocHandler())
    print(f"3. indexed: {target} ({len(rows)} files)")

    config = dict(
        data_path=root,
        datasets=["stdlib"],
        seq_length=256,
        batch_size=8,
        logical_shards=8,
        shuffle_window=32,
        bos_token=0,
        eos_token=1,
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
    print(
        f"4. streamed {len(batches)} batches of {tuple(batches[0]['input_ids'].shape)} with "
        f"{args.workers} worker(s): first after {first * 1e3:.0f} ms, then "
        f"{tokens / elapsed / 1e6:.1f} M tokens/s"
    )
    # Decoded with the tokenizer tokenize bundled into the root, as any reader of it can.
    with open(os.path.join(root, "metadata.json"), encoding="utf-8") as handle:
        bundled = json.load(handle)["tokenizer"]["file"]
    decoder = TextTokenizer(os.path.join(root, bundled))
    for row in range(2):
        text = decoder.decode(batches[0]["input_ids"][row, :64].tolist())
        print(f"   sample {row}: {text!r}")

    half = args.batches // 2
    head = build_dataloader(config)
    for _, _ in zip(range(half), head):
        pass
    state_path = os.path.join(work, "loader_state.fms")
    save_state(state_path, head.snapshot())
    resumed = build_dataloader(config)
    resumed.load_state_dict(load_state(state_path))
    rest = [b for _, b in zip(range(args.batches - half), resumed)]
    exact = all(torch.equal(a[k], b[k]) for a, b in zip(batches[half:], rest) for k in a)
    print(
        f"5. state after {half} batches: {os.path.getsize(state_path) / 1024:.1f} KiB; "
        f"resumed run {'matches' if exact else 'DIFFERS FROM'} the uninterrupted one"
    )
    return 0 if exact else 1
