"""Writers of every shard format, for tests and the format benchmark: one set of
documents, many layouts.

Where a format's own writer installs as a test dependency it is used as well
(megatron-core's ``IndexedDatasetBuilder``, mosaicml-streaming's ``MDSWriter``; the Hugging
Face cache layout is what ``datasets`` writes with pyarrow), and the writers below, which
follow ``FORMATS.md``, are checked byte for byte against them.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import pickle
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from fmsdata.handlers.arrow import write_arrow_docs
from fmsdata.handlers.megatron import write_megatron


def _path(root, dataset, f, suffix):
    folder = os.path.join(root, dataset)
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"part_{f:03d}{suffix}")


def write_arrow(root, files):
    for dataset, docs_per_file in files.items():
        for f, docs in enumerate(docs_per_file):
            write_arrow_docs(_path(root, dataset, f, ".arrow"), docs, dtype=np.uint16)


def _token_lists(docs):
    """Documents as one Arrow ``list<uint16>`` array, built from offsets (no Python lists)."""
    offsets = np.concatenate(([0], np.cumsum([len(d) for d in docs]))).astype(np.int32)
    values = np.concatenate(docs).astype(np.uint16) if docs else np.zeros(0, np.uint16)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def write_hf_arrow(root, files, rows_per_batch=8, file_format=False):
    schema = pa.schema([("input_ids", pa.list_(pa.uint16())), ("id", pa.int64())])
    for dataset, docs_per_file in files.items():
        for f, docs in enumerate(docs_per_file):
            path = _path(root, dataset, f, ".arrow")
            opener = pa.ipc.new_file if file_format else pa.ipc.new_stream
            with pa.OSFile(path, "wb") as sink, opener(sink, schema) as writer:
                for at in range(0, len(docs), rows_per_batch):
                    chunk = docs[at : at + rows_per_batch]
                    column = _token_lists(chunk)
                    ids = pa.array(range(at, at + len(chunk)), pa.int64())
                    writer.write_batch(pa.record_batch([column, ids], schema=schema))


def write_parquet_tokens(root, files, row_group=7):
    for dataset, docs_per_file in files.items():
        for f, docs in enumerate(docs_per_file):
            table = pa.table({"tokens": _token_lists(docs)})
            pq.write_table(table, _path(root, dataset, f, ".parquet"), row_group_size=row_group)


def write_parquet_text(root, texts, row_group=7):
    for dataset, texts_per_file in texts.items():
        for f, chunk in enumerate(texts_per_file):
            table = pa.table({"url": [f"u{i}" for i in range(len(chunk))], "text": chunk})
            pq.write_table(table, _path(root, dataset, f, ".parquet"), row_group_size=row_group)


def write_jsonl(root, texts, field="text", compression=None):
    suffix = {None: ".jsonl", "gz": ".jsonl.gz", "zst": ".jsonl.zst"}[compression]
    for dataset, texts_per_file in texts.items():
        for f, chunk in enumerate(texts_per_file):
            lines = "".join(
                json.dumps({"id": i, field: t}) + "\n" for i, t in enumerate(chunk)
            ).encode()
            data = {
                None: lambda b: b,
                "gz": gzip.compress,
                "zst": zstandard.ZstdCompressor().compress,
            }[compression](lines)
            with open(_path(root, dataset, f, suffix), "wb") as out:
                out.write(data)


def write_megatron_core(root, files):
    """With megatron-core's own builder (one sequence per document, uint16)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    for dataset, docs_per_file in files.items():
        for f, docs in enumerate(docs_per_file):
            prefix = _path(root, dataset, f, "")
            builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
            for doc in docs:
                builder.add_item(torch.from_numpy(doc.astype(np.int64)))
                builder.end_document()
            builder.finalize(prefix + ".idx")


def write_megatron_fmsdata(root, files):
    for dataset, docs_per_file in files.items():
        for f, docs in enumerate(docs_per_file):
            write_megatron(_path(root, dataset, f, ""), docs, np.uint16)


def pbin_bytes(docs, eod, token_size=2, index=None):
    """A Modalities .pbin: uint64 data length, uint32 token size, tokens, pickled index."""
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[token_size]
    pieces, pairs, at = [], [], 0
    for doc in docs:
        data = np.append(doc, eod).astype(dtype).tobytes()
        pieces.append(data)
        pairs.append((at, len(data)))
        at += len(data)
    body = b"".join(pieces)
    tail = pickle.dumps(pairs if index is None else index)
    return np.uint64(len(body)).tobytes() + np.uint32(token_size).tobytes() + body + tail


def write_pbin(root, files, eod):
    for dataset, docs_per_file in files.items():
        for f, docs in enumerate(docs_per_file):
            with open(_path(root, dataset, f, ".pbin"), "wb") as out:
                out.write(pbin_bytes(docs, eod))


def write_flat(root, files, eos, zero_tail=0, suffix=".npy"):
    """Headerless uint16 token streams, each document followed by ``eos``."""
    for dataset, docs_per_file in files.items():
        for f, docs in enumerate(docs_per_file):
            stream = np.concatenate(
                [np.append(d, eos) for d in docs] + [np.zeros(zero_tail)]
            ).astype(np.uint16)
            stream.tofile(_path(root, dataset, f, suffix))


def write_mds(root, files, encoding="bytes", compression=None):
    """An MDS folder per dataset, as ``MDSWriter`` lays it out (columns ``id``, ``tokens``),
    one shard per file of ``files``."""
    for dataset, docs_per_file in files.items():
        folder = os.path.join(root, dataset)
        os.makedirs(folder, exist_ok=True)
        shards = []
        names, encodings = ["id", "tokens"], ["int", encoding]
        sizes = [8, None]
        for s, chunk in enumerate(docs_per_file):
            samples = []
            for i, doc in enumerate(chunk):
                tokens = doc.astype(np.uint16)
                # ndarray: [dtype code,] ndim << 2 | shape dtype, shape (smallest uint), values
                shape_code = int(np.searchsorted([1 << 8, 1 << 16, 1 << 32], len(tokens), "right"))
                shape_type = (np.uint8, np.uint16, np.uint32, np.uint64)[shape_code]
                shape = (
                    bytes([(1 << 2) | shape_code]) + np.array([len(tokens)], shape_type).tobytes()
                )
                if encoding == "bytes":
                    payload = tokens.tobytes()
                elif encoding == "ndarray:uint16":
                    payload = shape + tokens.tobytes()
                else:  # "ndarray": the dtype is stored per sample
                    payload = bytes([16]) + shape + tokens.tobytes()
                head = np.array([len(payload)], np.uint32).tobytes()
                samples.append(head + np.int64(i).tobytes() + payload)
            config = {
                "column_encodings": encodings,
                "column_names": names,
                "column_sizes": sizes,
                "compression": compression,
                "format": "mds",
                "hashes": [],
                "size_limit": 1 << 26,
                "version": 2,
            }
            config_data = json.dumps(config, sort_keys=True).encode()
            offsets = np.array([0] + [len(x) for x in samples]).cumsum().astype(np.uint32)
            offsets += 4 + len(offsets.tobytes()) + len(config_data)
            data = (
                np.uint32(len(samples)).tobytes()
                + offsets.tobytes()
                + config_data
                + b"".join(samples)
            )
            raw = f"shard.{s:05d}.mds"
            entry = {
                **config,
                "raw_data": {"basename": raw, "bytes": len(data), "hashes": {}},
                "samples": len(samples),
                "zip_data": None,
            }
            if compression == "zstd":
                packed = zstandard.ZstdCompressor().compress(data)
                with open(os.path.join(folder, raw + ".zstd"), "wb") as out:
                    out.write(packed)
                entry["zip_data"] = {"basename": raw + ".zstd", "bytes": len(packed), "hashes": {}}
            else:
                with open(os.path.join(folder, raw), "wb") as out:
                    out.write(data)
            shards.append(entry)
        with open(os.path.join(folder, "index.json"), "w") as out:
            json.dump({"shards": shards, "version": 2}, out, sort_keys=True)


@functools.cache
def _mds_writer_class():
    """mosaicml-streaming's ``MDSWriter``, imported without ``streaming/__init__``: that
    package init imports torchvision and transformers, whose PyPI wheels do not load beside
    the pinned CPU torch. The writer modules themselves need neither."""
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("streaming")
    if spec is None or spec.origin is None:
        raise ImportError("mosaicml-streaming is a test dependency: pip install -e '.[test]'")
    home = os.path.dirname(spec.origin)
    for name, sub in (("streaming", ""), ("streaming.base", "base")):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(home, sub)]
        sys.modules[name] = package
    from streaming.base.format.mds.writer import MDSWriter

    return MDSWriter


def write_mds_streaming(root, files, encoding="bytes", compression=None):
    """With mosaicml-streaming's own ``MDSWriter``: one writer per file of ``files``
    into ``<dataset>/part_NNN/``, so each file becomes one shard with its own index."""
    writer_class = _mds_writer_class()
    for dataset, docs_per_file in files.items():
        for f, docs in enumerate(docs_per_file):
            out = os.path.join(root, dataset, f"part_{f:03d}")
            columns = {"id": "int", "tokens": encoding}
            with writer_class(out=out, columns=columns, compression=compression) as writer:
                for i, doc in enumerate(docs):
                    tokens = doc.astype(np.uint16)
                    value = tokens.tobytes() if encoding == "bytes" else tokens
                    writer.write({"id": i, "tokens": value})
