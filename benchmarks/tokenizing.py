"""``fmsdata tokenize`` tokens/s with 1 and 2 workers, beside a bare ``encode_batch``.

The corpus is the standard library's docstrings (repeated) as JSONL files; the tokenizer
is the bundled BPE one. The baseline is one ``tokenizers`` ``encode_batch`` call per 256
texts over the same texts, already in memory, in this process (its thread pool uses every
core). The tokenize runs include everything: reading and parsing JSON, encoding, writing
Arrow shards, hashing inputs and the metadata, and starting worker processes.

    python benchmarks/tokenizing.py            # ~16 M tokens
    python benchmarks/tokenizing.py --quick    # ~4 M tokens

Prints a table and writes ``benchmarks/results/tokenizing.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from benchlib import write_results

from fmsdata.handlers.text import TextTokenizer
from fmsdata.tokenize import TokenizeSpec, run_tokenize
from fmsdata.util.textcorpus import bundled_tokenizer_path, stdlib_docstrings

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = 8


def bare_encode(texts: list[str], tokenizer: str) -> tuple[int, float]:
    """(tokens, seconds) of ``encode_batch`` over ``texts`` in batches of 256."""
    encoder = TextTokenizer(tokenizer)
    encoder.encode(texts[:256])  # load the tokenizer and start its threads
    start = time.perf_counter()
    tokens = sum(
        len(ids) for k in range(0, len(texts), 256) for ids in encoder.encode(texts[k : k + 256])
    )
    return tokens, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smaller corpus")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "tokenizing.json"))
    args = parser.parse_args()
    texts = list(stdlib_docstrings()) * (20 if args.quick else 80)
    tokenizer = bundled_tokenizer_path()
    scratch = tempfile.mkdtemp(prefix="fmsdata-tokenize-")
    results: dict[str, Any] = {"texts": len(texts), "cpus": os.cpu_count()}
    try:
        raw = os.path.join(scratch, "raw")
        os.makedirs(raw)
        for k in range(FILES):
            with open(os.path.join(raw, f"part-{k}.jsonl"), "w", encoding="utf-8") as out:
                for text in texts[k::FILES]:
                    out.write(json.dumps({"text": text}) + "\n")
        results["input_bytes"] = sum(os.path.getsize(os.path.join(raw, f)) for f in os.listdir(raw))
        tokens, seconds = bare_encode(texts, tokenizer)
        results["tokens"] = tokens
        results["bare encode_batch"] = tokens / seconds
        for workers in (1, 2):
            spec = TokenizeSpec(
                os.path.join(scratch, f"out-{workers}"), "stdlib", tokenizer, shard_bytes=2 << 20
            )
            start = time.perf_counter()
            result = run_tokenize(spec, [raw], workers=workers)
            seconds = time.perf_counter() - start
            if result.tokens != tokens:
                raise RuntimeError(f"tokenize wrote {result.tokens} tokens, expected {tokens}")
            results[f"tokenize, {workers} worker(s)"] = tokens / seconds
            results["shards"] = result.units
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    base = results["bare encode_batch"]
    print(
        f"{results['tokens'] / 1e6:.1f} M tokens, {results['input_bytes'] / 1e6:.0f} MB JSONL, "
        f"{results['shards']} shards\n"
    )
    print(f"{'':28} {'tokens/s':>12} {'vs encode_batch':>16}")
    for name in ("bare encode_batch", "tokenize, 1 worker(s)", "tokenize, 2 worker(s)"):
        print(f"{name:28} {results[name] / 1e6:10.2f} M {results[name] / base:16.2f}")
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
