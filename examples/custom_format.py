"""Add your own shard format: subclass ``FileHandler``, register it, select it by name.

The format here is a simple one many in-house pipelines have: ``NAME.tok`` holds uint32
tokens back to back and the sidecar ``NAME.len`` holds the magic ``TOKLEN01`` then one
int64 length per document. The handler memory-maps both, so documents are zero-copy
views and a worker's memory stays flat however large the files are; bad files raise
``ShardFormatError`` naming the file and what is wrong. Since its documents are ranges
of one flat token buffer, it derives from ``FlatBufferHandler`` and only writes ``open``
(a format without such a buffer subclasses ``FileHandler`` and writes ``num_docs`` and
``get`` too).

Run it (no downloads; it writes a small corpus first):

    python examples/custom_format.py

It converts a generated Arrow corpus to ``.tok``/``.len``, loads both through the same
config, checks the batches match, then checks a resume from a saved state.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch

from fmsdata import ShardFormatError, build_dataloader, register_handler
from fmsdata.data.synthetic import write_corpus
from fmsdata.handlers import ArrowDocHandler, FlatBuffer, FlatBufferHandler, MappedFile

LENGTHS_MAGIC = b"TOKLEN01"


class TokLenReader(FlatBuffer):
    """One open ``.tok`` shard: the token map and where each document starts."""

    def __init__(self, path: str):
        lengths_path = path[: -len(".tok")] + ".len"
        if not os.path.exists(lengths_path):
            raise ShardFormatError(f"{path}: its lengths file {lengths_path} is missing")
        lengths_file = MappedFile(lengths_path)
        if bytes(lengths_file.bytes[:8]) != LENGTHS_MAGIC:
            raise ShardFormatError(f"{lengths_path}: bad magic, expected {LENGTHS_MAGIC!r}")
        lengths = lengths_file.view(np.int64, offset=8)
        if len(lengths) and lengths.min() < 0:
            raise ShardFormatError(f"{lengths_path}: negative document length")
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        tokens_file = MappedFile(path)
        tokens = tokens_file.view(np.dtype("<u4"))
        total = int(lengths.sum())
        if total != len(tokens):
            raise ShardFormatError(
                f"{path}: holds {len(tokens)} tokens, its lengths file says {total}"
            )
        # Documents are ranges of one flat token buffer: FlatBufferHandler does the rest
        # (``get``, lengths from metadata, lines copied straight out of the map).
        super().__init__(path, tokens, starts, lengths, [tokens_file, lengths_file])


class TokLenHandler(FlatBufferHandler):
    """``.tok`` token streams with ``.len`` document lengths beside them."""

    name = "toklen"
    extensions = (".tok",)

    @classmethod
    def companions(cls, path: str) -> list[str]:
        # Fetched with the shard when the data root is remote.
        return [path[: -len(".tok")] + ".len"]

    def open(self, path: str) -> TokLenReader:
        return TokLenReader(path)


def write_toklen(path: str, documents: list[np.ndarray]) -> None:
    """Write documents as ``path.tok`` + ``path.len``."""
    np.concatenate(documents).astype("<u4").tofile(path + ".tok")
    lengths = np.array([len(d) for d in documents], dtype="<i8")
    with open(path + ".len", "wb") as out:
        out.write(LENGTHS_MAGIC + lengths.tobytes())


def convert_arrow_corpus(arrow_root: str, files: list[str], target_root: str) -> None:
    arrow = ArrowDocHandler()
    for rel in files:
        reader = arrow.open(os.path.join(arrow_root, rel))
        docs = [np.asarray(arrow.get(reader, i)) for i in range(arrow.num_docs(reader))]
        arrow.close(reader)
        target = os.path.join(target_root, rel[: -len(".arrow")])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        write_toklen(target, docs)


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"])
        for x, y in zip(a, b)
    )


def take(loader, n: int) -> list[dict]:
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == n:
            break
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where to write the example corpus (default: a temp dir)")
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="fmsdata-custom-")

    info = write_corpus(os.path.join(root, "arrow"), {"web": 4, "code": 3}, first_token=16)
    convert_arrow_corpus(info.root, info.files, os.path.join(root, "toklen"))
    register_handler(TokLenHandler)

    config = dict(
        datasets=["web", "code"],
        weights=[3, 1],
        seq_length=128,
        batch_size=4,
        logical_shards=4,
        bos_token=1,
        eos_token=2,
        num_workers=1,
    )
    arrow_batches = take(
        build_dataloader({**config, "data_path": info.root, "file_type": "arrow"}), args.batches
    )
    toklen_config = {**config, "data_path": os.path.join(root, "toklen"), "file_type": "toklen"}
    toklen_batches = take(build_dataloader(toklen_config), args.batches)
    print(f"{len(toklen_batches)} batches from .tok/.len files")
    print(f"same batches as the Arrow original: {same(arrow_batches, toklen_batches)}")

    half = args.batches // 2
    first = build_dataloader(toklen_config)
    take(first, half)
    resumed = build_dataloader(toklen_config)
    resumed.load_state_dict(first.state_dict())
    continued = take(resumed, args.batches - half)
    print(f"resumed run continues exactly: {same(toklen_batches[half:], continued)}")


if __name__ == "__main__":
    main()
