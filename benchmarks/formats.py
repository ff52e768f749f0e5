"""Tokens/s per worker for every shard format, beside a bare read of the same tokens.

One set of generated documents (uint16 tokens) is written in every token format; the
loader runs over each with one DataLoader worker and the same config. The baseline is a
bare memory-mapped read of the same tokens (the flat ``.npy`` files) into int64 tensors
of ``seq_length + 1`` tokens. Text formats (JSONL, Parquet text) are timed on the standard
library's docstrings under the bundled tokenizer: one pass from a fresh loader while
tokenizing (beside a bare ``encode_batch`` of the same texts), then JSONL's steady rate from
its token cache (short documents: ~150 tokens against ~1,150 in the token formats).

    python benchmarks/formats.py            # ~16 M tokens per format
    python benchmarks/formats.py --quick    # ~4 M tokens per format

Prints a table and writes ``benchmarks/results/formats.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from benchlib import generated_documents, write_results  # noqa: E402
from formats import (  # noqa: E402  (the shared format writers live beside the tests)
    write_arrow,
    write_flat,
    write_hf_arrow,
    write_jsonl,
    write_mds,
    write_megatron_fmsdata,
    write_parquet_text,
    write_parquet_tokens,
    write_pbin,
)

from fmsdata import build_dataloader  # noqa: E402
from fmsdata.cli.bench import tokens_per_second  # noqa: E402
from fmsdata.handlers.text import TextTokenizer  # noqa: E402
from fmsdata.util.textcorpus import bundled_tokenizer_path, stdlib_docstrings  # noqa: E402

EOS = 1
SEQ = 4096

TOKEN_FORMATS: dict[str, tuple[Callable[[str, Any], None], dict[str, Any]]] = {
    "arrow (Bamba)": (write_arrow, {"file_type": "arrow"}),
    "hf_arrow": (
        lambda root, docs: write_hf_arrow(root, docs, rows_per_batch=1000, file_format=True),
        {"file_type": "hf_arrow", "col_name": "input_ids"},
    ),
    "parquet tokens": (
        lambda root, docs: write_parquet_tokens(root, docs, row_group=1000),
        {"file_type": "parquet"},
    ),
    "megatron": (write_megatron_fmsdata, {"file_type": "megatron"}),
    "pbin": (lambda root, docs: write_pbin(root, docs, EOS), {"file_type": "pbin"}),
    "npy (flat)": (lambda root, docs: write_flat(root, docs, EOS), {"file_type": "npy"}),
    "mds": (write_mds, {"file_type": "mds"}),
}


def bare_read(paths: list[str], line_length: int, seconds: float) -> float:
    """Tokens/s of reading consecutive windows of flat uint16 files into int64 tensors."""
    tokens = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for path in paths:
            data = np.memmap(path, dtype=np.uint16, mode="r")
            for at in range(0, len(data) - line_length, line_length):
                torch.from_numpy(data[at : at + line_length].astype(np.int64))
                tokens += line_length - 1
    return tokens / (time.perf_counter() - start)


def loader_config(root: str, **options: Any) -> dict[str, Any]:
    return dict(
        data_path=root,
        datasets=["web", "code"],
        weights=[0.7, 0.3],
        seq_length=SEQ,
        batch_size=8,
        logical_shards=16,
        shuffle_window=16,
        bos_token=0,
        eos_token=EOS,
        strip_tokens=[EOS],
        token_dtype="uint16",
        tokenizer=bundled_tokenizer_path(),
        num_workers=1,
        **options,
    )


def rate(config: dict[str, Any], warmup: int, batches: int) -> float:
    return tokens_per_second(iter(build_dataloader(config)), warmup, batches)


def epoch_rate(config: dict[str, Any], batches: int) -> float:
    """Tokens/s of one pass over a text corpus from a fresh loader, start-up included: the
    tokenizing happens inside it, so there is no steady state to time after a warmup."""
    start = time.perf_counter()
    iterator = iter(build_dataloader(config))
    tokens = sum(next(iterator)["input_ids"].numel() for _ in range(batches))
    return tokens / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller corpus, fewer batches")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "formats.json"))
    args = parser.parse_args()
    files, docs = (4, 700) if args.quick else (8, 1400)
    warmup, batches = (100, 3000) if args.quick else (200, 10000)
    seconds = 2.0 if args.quick else 5.0

    scratch = tempfile.mkdtemp(prefix="fmsdata-formats-")
    os.environ["FMSDATA_CACHE"] = os.path.join(scratch, "cache")
    results: dict[str, Any] = {"seq_length": SEQ, "batch_size": 8, "num_workers": 1}
    try:
        documents = generated_documents(files, docs)
        total = sum(len(d) for fs in documents.values() for f in fs for d in f)
        results["tokens_per_format"] = total
        for name, (write, options) in TOKEN_FORMATS.items():
            root = os.path.join(scratch, name.split()[0])
            write(root, documents)
            if name.startswith("npy"):
                flat = sorted(
                    os.path.join(d, f)
                    for d, _, fs in os.walk(root)
                    for f in fs
                    if f.endswith("npy")
                )
                results["bare_read_tokens_per_s"] = bare_read(flat, SEQ + 1, seconds)
            results[name] = rate(loader_config(root, **options), warmup, batches)
            print(f"{name:24} {results[name] / 1e6:8.1f} M tokens/s", flush=True)

        texts = list(stdlib_docstrings())
        repeat = 2 if args.quick else 8
        corpus = {"web": [texts * repeat], "code": [texts[::-1] * repeat]}
        tokenizer = TextTokenizer(bundled_tokenizer_path())
        start = time.perf_counter()
        text_tokens = sum(
            len(ids) for chunk in corpus.values() for ids in tokenizer.encode(chunk[0])
        )
        results["bare_encode_tokens_per_s"] = text_tokens / (time.perf_counter() - start)
        epoch = text_tokens // (8 * SEQ)
        write_jsonl(os.path.join(scratch, "jsonl"), corpus)
        jsonl = loader_config(os.path.join(scratch, "jsonl"), file_type="jsonl")
        results["jsonl, cold (tokenizing)"] = epoch_rate(jsonl, epoch)
        results["jsonl, warm (token cache)"] = rate(jsonl, warmup, batches)
        write_parquet_text(os.path.join(scratch, "parquet_text"), corpus, row_group=200)
        parquet_text = loader_config(os.path.join(scratch, "parquet_text"), file_type="parquet")
        results["parquet text (tokenizing)"] = epoch_rate(parquet_text, epoch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    bare = results["bare_read_tokens_per_s"]
    print(f"\n{'format (1 worker)':34} {'tokens/s':>12} {'vs bare read':>12}")
    print(f"{'bare memmap read':34} {bare / 1e6:10.1f} M {1.0:12.2f}")
    for name in [*TOKEN_FORMATS, "jsonl, cold (tokenizing)", "jsonl, warm (token cache)"]:
        print(f"{name:34} {results[name] / 1e6:10.1f} M {results[name] / bare:12.2f}")
    name = "parquet text (tokenizing)"
    print(f"{name:34} {results[name] / 1e6:10.1f} M {results[name] / bare:12.2f}")
    encode = results["bare_encode_tokens_per_s"]
    print(f"{'bare encode_batch of the texts':34} {encode / 1e6:10.1f} M")
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
