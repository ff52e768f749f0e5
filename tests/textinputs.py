"""Raw text inputs for the tokenize tests and a reader of a tokenize output tree."""

import io
import json
import os

import zstandard

BAD_LINES = ["this is not json", json.dumps({"other": "field"}), json.dumps({"text": 7})]


def write_jsonl(path, texts, bad_every=0, opener=open):
    with opener(path, "wt", encoding="utf-8") as out:
        for k, text in enumerate(texts):
            out.write(json.dumps({"text": text}) + "\n")
            if bad_every and k % bad_every == bad_every - 1:
                out.write(BAD_LINES[(k // bad_every) % len(BAD_LINES)] + "\n")


def zst_open(path, mode, encoding):
    raw = open(path, "wb")
    return io.TextIOWrapper(zstandard.ZstdCompressor().stream_writer(raw), encoding=encoding)


def output_files(root):
    """Every output file of a tokenize root (shards, counts, metadata) -> bytes."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if rel.startswith(os.path.join("meta", "tokenize")):
                continue  # the run's own bookkeeping
            with open(path, "rb") as handle:
                found[rel] = handle.read()
    return found
