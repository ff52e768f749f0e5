"""A fixed amount of loader work in process, to time from outside (``/usr/bin/time``).

Builds the loader of ``benchmarks/throughput.py`` over one of its corpora (written there
with ``--prepare``; seq 4096, batch 8, 64 logical shards, about 10,000 buffered lines,
no workers) and takes its warm-up batches and then ``BATCHES`` more. Timing the whole
process of two commits alternately, several times, compares them when the machine's speed
drifts; the import and the warm-up are in every run alike.

    python benchmarks/throughput.py --prepare --corpora short
    /usr/bin/time -v python benchmarks/fixed_run.py short 30000
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import throughput  # noqa: E402  (the corpora and settings are throughput's)

from fmsdata import build_dataloader  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", choices=sorted(throughput.CORPORA))
    parser.add_argument("batches", type=int)
    parser.add_argument("--data", default=throughput.DATA)
    args = parser.parse_args()
    root = os.path.join(args.data, f"{args.corpus}-1.0")
    config = {**throughput.loader_config(args.corpus, root), "num_workers": 0}
    batches = iter(build_dataloader(config))
    for _ in range(throughput.WARMUP + args.batches):
        next(batches)


if __name__ == "__main__":
    main()
