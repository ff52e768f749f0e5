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

from fmsdata.cli.parser import PathArg, add_command, int_at_least, positive_int

__all__ = ["add_parser", "run", "write_raw", "next_steps"]

RAW_FILES = 4


HELP = "tokenize the stdlib's docstrings and stream them: the whole path, end to end"
DESCRIPTION = (
    "Write the standard library's docstrings as JSONL, tokenize them with the "
    "bundled BPE tokenizer into Arrow shards, index them, stream batches (decoded "
    "samples, throughput), save the loader state, resume it and verify the batches "
    "match. With --dir, a rerun reuses what is there; it ends with a loader config "
    "for the output and the commands to use it."
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = add_command(commands, "demo", run, HELP, DESCRIPTION)
    parser.add_argument(
        "--dir",
        type=PathArg("local"),
        help="where to write (default: a new temporary folder)",
    )
    parser.add_argument(
        "--batches",
        type=int_at_least(2, "half are streamed before the state is saved, the rest compared"),
        default=200,
        help="batches to stream (at least 2: the first half before the state is saved, "
        "the rest compared after resuming)",
    )
    parser.add_argument(
        "--workers", type=positive_int, default=2, help="tokenizer and loader workers"
    )


def write_raw(folder: str) -> tuple[int, int]:
    """The docstrings as ``RAW_FILES`` JSONL files; returns (documents, characters).

    A file already holding exactly these bytes is left alone (its modification time
    too), so that a rerun finds the same inputs and tokenize skips its finished shards.
    """
    from fmsdata.util.textcorpus import stdlib_docstrings

    os.makedirs(folder, exist_ok=True)
    texts = list(stdlib_docstrings())
    for k in range(RAW_FILES):
        data = "".join(json.dumps({"text": t}) + "\n" for t in texts[k::RAW_FILES]).encode()
        path = os.path.join(folder, f"stdlib-{k}.jsonl")
        if os.path.isfile(path) and os.path.getsize(path) == len(data):
            with open(path, "rb") as handle:
                if handle.read() == data:
                    continue
        partial = f"{path}.tmp{os.getpid()}"
        with open(partial, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    return len(texts), sum(len(t) for t in texts)


def loader_config(root: str, workers: int) -> dict:
    """The demo's loader settings, with BOS/EOS from the root's metadata.json."""
    from fmsdata.data.metadata import read_metadata, special_token_ids
    from fmsdata.errors import ConfigError

    tokens = special_token_ids(read_metadata(root) or {})
    if "bos" not in tokens or "eos" not in tokens:
        raise ConfigError(f"{root}/metadata.json names no BOS/EOS token: {tokens}")
    return dict(
        data_path=root,
        datasets=["stdlib"],
        seq_length=256,
        batch_size=8,
        logical_shards=8,
        shuffle_window=32,
        bos_token=tokens["bos"],
        eos_token=tokens["eos"],
        num_workers=workers,
        return_position_ids=True,
    )


def next_steps(work: str, config: dict) -> list[str]:
    """Write ``WORK/loader.yaml`` for the demo's output; the lines telling what to run next."""
    import yaml

    path = os.path.join(work, "loader.yaml")
    kept = {k: v for k, v in config.items() if k != "return_position_ids"}
    with open(path, "w", encoding="utf-8") as out:
        out.write("# Written by fmsdata demo: a loader over its tokenized stdlib docstrings.\n")
        yaml.safe_dump(kept, out, sort_keys=False)
    root = config["data_path"]
    example, where = _train_example()
    return [
        "next:",
        f"  a loader config for this data (bos_token {config['bos_token']}, eos_token "
        f"{config['eos_token']}, from its metadata.json): {path}",
        f'    in Python:  loader = fmsdata.build_dataloader("{path}")',
        f"    measure it: fmsdata bench {path}",
        f"  look at the data (decoded with the tokenizer bundled in it): fmsdata inspect {root}",
        f"  train a small model on it, on 2 processes ({where}; BOS/EOS and vocabulary "
        "come from the data's metadata.json):",
        f"    torchrun --nproc_per_node 2 {example} --data {root} --steps 100 "
        f"--ckpt-dir {os.path.join(work, 'ckpt')} --ckpt-every 50 "
        f"--hash-log {os.path.join(work, 'hashes.jsonl')}",
    ]


def _train_example() -> tuple[str, str]:
    """The FSDP example's path, absolute when this package runs from a checkout (an
    editable install), and where the printed command runs from."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    example = os.path.join(checkout, "examples", "train_fsdp.py")
    if os.path.isfile(example):
        return example, "from any folder"
    return "examples/train_fsdp.py", "from a checkout of the fmsdata repository"


def run(args: argparse.Namespace) -> int:
    import torch

    from fmsdata.data.indexing import index_root
    from fmsdata.handlers import ArrowDocHandler
    from fmsdata.handlers.text import TextTokenizer
    from fmsdata.loader import build_dataloader
    from fmsdata.state.file import load_state, save_state
    from fmsdata.tokenize import TokenizeSpec, run_tokenize
    from fmsdata.util.textcorpus import bundled_tokenizer_path

    # Absolute, so the commands it prints run from any folder.
    work = os.path.abspath(args.dir) if args.dir else tempfile.mkdtemp(prefix="fmsdata-demo-")
    raw, root = os.path.join(work, "raw"), os.path.join(work, "tokens")
    tokenizer = bundled_tokenizer_path()
    docs, chars = write_raw(raw)
    print(f"1. corpus: {docs:,} stdlib docstrings ({chars / 1e6:.1f} M characters) in {raw}")

    start = time.perf_counter()
    spec = TokenizeSpec(root, "stdlib", tokenizer, shard_bytes=200_000)
    result = run_tokenize(spec, [raw], workers=args.workers)
    seconds = time.perf_counter() - start
    reused = f", {result.skipped} of them already there" if result.skipped else ""
    print(
        f"2. tokenized into {result.units} Arrow shards in {root}/stdlib{reused}: "
        f"{result.documents:,} documents, {result.tokens:,} tokens in {seconds:.1f} s "
        f"({args.workers} worker process(es), start-up included)"
    )
    target, rows = index_root(root, ArrowDocHandler())
    print(f"3. indexed: {target} ({len(rows)} files)")

    config = loader_config(root, args.workers)
    loader = build_dataloader(config)
    start = time.perf_counter()
    iterator = iter(loader)
    batches = [next(iterator)]
    first = time.perf_counter() - start
    warm = (args.batches - 1) // 2  # batches after the first not timed
    for i in range(args.batches - 1):
        if i == warm:
            start = time.perf_counter()
        batches.append(next(iterator))
    elapsed = time.perf_counter() - start
    tokens = sum(b["input_ids"].numel() for b in batches[warm + 1 :])
    print(
        f"4. streamed {len(batches)} batches of {tuple(batches[0]['input_ids'].shape)} with "
        f"{args.workers} worker(s): first after {first * 1e3:.0f} ms, then "
        f"{tokens / elapsed / 1e6:.1f} M tokens/s\n"
        "   (on a machine that never ran fmsdata, its kernels compile in the background "
        "meanwhile and these batches are made in Python: `fmsdata bench` times the steady "
        "state, `fmsdata warm` compiles ahead)"
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
    exact = len(rest) == len(batches) - half and all(
        torch.equal(a[k], b[k]) for a, b in zip(batches[half:], rest) for k in a
    )
    compared = len(rest)
    print(
        f"5. state after {half} batches: {os.path.getsize(state_path) / 1024:.1f} KiB; "
        f"resumed run {'matches' if exact else 'DIFFERS FROM'} the uninterrupted one "
        f"({compared} batches compared)"
    )
    if not exact:
        return 1
    print()
    print("\n".join(next_steps(work, config)))
    return 0
