"""Token shard writers of the ``tokenize --format`` options the handlers do not write.

``flat`` (tatm / OLMo): a headerless token stream, EOS after every document, and a
``<file>.json`` sidecar naming the dtype. ``pbin`` (Modalities): a header, the tokens of
every document followed by its end-of-document token, and the pickled
``(byte offset, byte length)`` index Modalities' ``EmbeddedStreamData`` reads. ``mds``
(MosaicML streaming): one ``shard.NNNNN.mds`` with a single ``tokens`` column of encoding
``ndarray:<dtype>``; the folder's ``index.json`` entry is returned and written once every
shard of the run is done (``mds_index``). Every file goes to a temporary name first.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from fmsdata.errors import ConfigError, ShardFormatError

__all__ = ["write_flat", "write_pbin", "write_mds_shard", "mds_index", "MDS_COLUMN"]

MDS_COLUMN = "tokens"
_MDS_SHAPE_TYPES = ("uint8", "uint16", "uint32", "uint64")
_MDS_LIMIT = 1 << 32  # sample offsets are uint32


def write_flat(path: str, docs: Iterable[np.ndarray], eos: int, dtype: Any) -> None:
    """Documents back to back, each followed by ``eos``, plus ``path.json`` = the dtype."""
    dtype = np.dtype(dtype)
    with open(path + ".tmp", "wb") as out:
        for doc in docs:
            out.write(np.append(np.asarray(doc, dtype=dtype), dtype.type(eos)).tobytes())
    with open(path + ".json.tmp", "w") as out:
        json.dump({"dtype": dtype.name, "eos_token": int(eos)}, out)
    os.replace(path + ".json.tmp", path + ".json")
    os.replace(path + ".tmp", path)


def write_pbin(path: str, docs: Iterable[np.ndarray], eos: int, dtype: Any) -> None:
    """A Modalities ``.pbin``: uint64 data length, uint32 token size, tokens (each document
    ends with ``eos``), then the pickled list of ``(byte offset, byte length)``."""
    dtype = np.dtype(dtype)
    if dtype.itemsize not in (1, 2, 4) or dtype.kind != "u":
        raise ConfigError(f".pbin files hold uint8/16/32 tokens, not {dtype.name}")
    index: list[tuple[int, int]] = []
    at = 0
    with open(path + ".tmp", "wb") as out:
        out.write(b"\0" * 12)
        for doc in docs:
            data = np.append(np.asarray(doc, dtype=dtype), dtype.type(eos)).tobytes()
            out.write(data)
            index.append((at, len(data)))
            at += len(data)
        out.write(pickle.dumps(index))
        out.seek(0)
        out.write(np.uint64(at).tobytes() + np.uint32(dtype.itemsize).tobytes())
    os.replace(path + ".tmp", path)


def write_mds_shard(path: str, docs: Iterable[np.ndarray], dtype: Any) -> dict[str, Any]:
    """One MDS shard of a ``tokens`` column (``ndarray:<dtype>``, one document per sample);
    returns its ``index.json`` entry. Empty documents cannot be stored (streaming refuses
    zero-size arrays); tokenize drops them before they get here."""
    dtype = np.dtype(dtype)
    config = {
        "column_encodings": [f"ndarray:{dtype.name}"],
        "column_names": [MDS_COLUMN],
        "column_sizes": [None],
        "compression": None,
        "format": "mds",
        "hashes": [],
        "size_limit": _MDS_LIMIT - 1,
        "version": 2,
    }
    header = json.dumps(config, sort_keys=True).encode()
    sizes: list[int] = []
    with open(path + ".body.tmp", "wb") as body:
        for doc in docs:
            tokens = np.asarray(doc, dtype=dtype)
            if not len(tokens):
                raise ShardFormatError(f"{path}: MDS cannot store an empty document")
            shape_type = _MDS_SHAPE_TYPES[
                int(np.searchsorted([1 << 8, 1 << 16, 1 << 32], len(tokens), "right"))
            ]
            payload = (
                bytes([(1 << 2) | _MDS_SHAPE_TYPES.index(shape_type)])
                + np.array([len(tokens)], shape_type).tobytes()
                + tokens.tobytes()
            )
            body.write(np.uint32(len(payload)).tobytes() + payload)
            sizes.append(4 + len(payload))
    n = len(sizes)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    offsets += 4 + 4 * (n + 1) + len(header)
    if offsets[-1] >= _MDS_LIMIT:
        os.remove(path + ".body.tmp")
        raise ConfigError(
            f"{path}: {int(offsets[-1])} bytes is past the 4 GiB an MDS shard can address; "
            "use a smaller --shard-size"
        )
    with open(path + ".tmp", "wb") as out, open(path + ".body.tmp", "rb") as body:
        out.write(np.uint32(n).tobytes() + offsets.astype(np.uint32).tobytes() + header)
        while chunk := body.read(1 << 24):
            out.write(chunk)
    os.remove(path + ".body.tmp")
    os.replace(path + ".tmp", path)
    return {
        **config,
        "raw_data": {"basename": os.path.basename(path), "bytes": int(offsets[-1]), "hashes": {}},
        "samples": n,
        "zip_data": None,
    }


def mds_index(folder: str, entries: Sequence[dict[str, Any]]) -> None:
    """Write ``folder/index.json`` listing ``entries`` (shards in order)."""
    target = os.path.join(folder, "index.json")
    with open(target + ".tmp", "w") as out:
        json.dump({"shards": list(entries), "version": 2}, out, sort_keys=True)
    os.replace(target + ".tmp", target)
