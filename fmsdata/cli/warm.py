"""``fmsdata warm [CONFIG ...]``: compile the loader's kernels into numba's disk cache now.

A process that finds its kernels in the cache loads them in milliseconds; one that does not
serves its first batches in Python while it compiles them (``fmsdata.util.compiled``). Where
every job starts on a fresh machine or container, run this once where the cache is kept:
in the image build (``RUN fmsdata warm``), or on a shared cache folder. Kernels are
compiled per argument type: ``DESCRIPTION`` (its ``--help``) says what it runs for that.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

from fmsdata.cli.parser import PathArg, add_command

__all__ = ["add_parser", "run", "warm_config", "builtin_configs"]


HELP = "compile the loader's kernels into the disk cache (container builds, fresh hosts)"
DESCRIPTION = (
    "Compile fmsdata's numba kernels into numba's disk cache, so that later processes "
    "load them instead of compiling them: for each CONFIG given (batches with 0 and 1 "
    "workers), and with no CONFIG for small generated corpora covering the built-in "
    "stages and outputs. The cache is numba's: __pycache__ beside the installed "
    "package, or NUMBA_CACHE_DIR."
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = add_command(commands, "warm", run, HELP, DESCRIPTION)
    parser.add_argument(
        "configs",
        nargs="*",
        metavar="CONFIG",
        type=PathArg("local"),
        help="loader config YAML files",
    )
    parser.add_argument(
        "--overrides", nargs="*", default=[], help="config overrides, key=value (every CONFIG)"
    )


def warm_config(config: Any, extra_batches: int = 256) -> int:
    """Take batches of ``config`` with 0 and 1 DataLoader workers: through the shuffle
    buffers' fill and ``extra_batches`` more, so that the kernels of the steady state
    (buffers compacted as lines come and go) are compiled too; returns the batches taken.
    A kernel a run reaches only later is compiled in the background when it does."""
    from fmsdata.cli.bench import fill_batches
    from fmsdata.loader import build_dataloader

    taken = 0
    for workers in (0, 1):
        loader = build_dataloader(config.replace(num_workers=workers), rank=0, world_size=1)
        wanted = fill_batches(loader) + extra_batches
        for taken_here, _ in enumerate(loader, 1):
            if taken_here >= wanted:
                break
        taken += wanted
        del loader
    return taken


def builtin_configs(folder: str) -> list[Any]:
    """Configs over small generated corpora in ``folder``: uint16 and uint32 tokens, hard,
    pad and best_fit packing, position and document ids, a weight schedule."""
    import numpy as np

    from fmsdata.config import LoaderConfig
    from fmsdata.data.synthetic import write_corpus

    configs = []
    for dtype in (np.uint16, np.uint32):
        root = os.path.join(folder, np.dtype(dtype).name)
        write_corpus(root, {"a": 2, "b": 2}, docs_per_file=30, mean_length=60, dtype=dtype)
        base: dict[str, Any] = dict(
            data_path=root,
            datasets=["a", "b"],
            weights=[2.0, 1.0],
            seq_length=64,
            batch_size=4,
            logical_shards=4,
            shuffle_window=8,
            bos_token=1,
            eos_token=2,
        )
        configs.append(LoaderConfig.from_dict(base))
        configs.append(
            LoaderConfig.from_dict(
                {**base, "packing": "pad", "pad_token": 0, "return_position_ids": True}
            )
        )
        configs.append(LoaderConfig.from_dict({**base, "return_document_ids": True}))
        configs.append(
            LoaderConfig.from_dict(
                {**base, "packing": "best_fit", "pad_token": 0, "return_cu_seqlens": True}
            )
        )
        schedule = [[0, [1.0, 1.0]], [2000, [1.0, 3.0]]]
        configs.append(
            LoaderConfig.from_dict({**base, "weights": None, "weight_schedule": schedule})
        )
    return configs


def run(args: argparse.Namespace) -> int:
    from fmsdata.config import LoaderConfig
    from fmsdata.util import compiled

    started = time.perf_counter()
    batches = 0
    # Compile here, in this process and its workers, rather than serve batches in Python.
    with compiled.serving("foreground"):
        if args.configs:
            for path in args.configs:
                batches += warm_config(LoaderConfig.from_yaml(path, args.overrides))
        else:
            with tempfile.TemporaryDirectory(prefix="fmsdata-warm-") as folder:
                for config in builtin_configs(folder):
                    batches += warm_config(config)
    kernels = compiled.compiled_count()
    print(
        f"{kernels} kernel(s) compiled into the cache in this process (more in its "
        f"DataLoader workers) over {batches} batches in "
        f"{time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return 0
