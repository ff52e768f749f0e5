"""Shard chains built from a config, as the loader builds them, for stage-level tests."""

from __future__ import annotations

from typing import Any

from support import accesses

from fmsdata.config import LoaderConfig
from fmsdata.data.synthetic import CorpusInfo
from fmsdata.stages.base import Stage
from fmsdata.stages.documents import Decoration
from fmsdata.stages.shard import ShardRecipe
from fmsdata.stages.spans import DOC, DS, FILE, START
from fmsdata.worker.chain import build_pipeline


def recipe(info: CorpusInfo, **fields: Any) -> ShardRecipe:
    config = LoaderConfig(data_path=info.root, **fields)
    return ShardRecipe.from_config(config, [a.name for a in accesses(info, config.datasets)])


def chain(info: CorpusInfo, rec: ShardRecipe, shard: int) -> Stage:
    """Logical shard ``shard``'s default chain (its own reader cache)."""
    return build_pipeline(shard, rec, accesses(info, list(rec.names))).top


def document_starts(info: CorpusInfo, rec: ShardRecipe, line: Any) -> list[tuple[str, str, int]]:
    """``(dataset, file path, document)`` of each document that starts in ``line``."""
    acc = {a.name: a for a in accesses(info, list(rec.names))}
    out = []
    for span in line.tolist():
        if span[START] == 0:
            name = rec.names[span[DS]]
            out.append((name, acc[name].path(span[FILE]), span[DOC]))
    return out


def writer_order(info: CorpusInfo, name: str) -> list[tuple[str, str, int]]:
    """The dataset's documents in the order the writer wrote them (files in order)."""
    return [
        (name, path, d)
        for path, (firsts, _) in info.files.items()
        if path.split("/")[0] == name
        for d in range(len(firsts))
    ]


def take_documents(stream: Any, n: int) -> list[tuple[int, int]]:
    """``(file, doc)`` of the next ``n`` kept documents of a document stream, committed in
    uneven bites and read ahead again after each, as a packer does."""
    out: list[tuple[int, int]] = []
    bite = 1
    while len(out) < n:
        block = stream.read_ahead()
        take = min(len(block), n - len(out), bite)
        out.extend(zip(block.file[:take].tolist(), block.doc[:take].tolist()))
        stream.commit(take)
        stream.rewind()
        bite = bite * 3 % 17 + 1
    return out


def documents_by_epoch(stream: Any, stop: int) -> dict[int, list[tuple[str, int]]]:
    """``{epoch: [(file path, doc), ...]}`` for a document stream's epochs below ``stop``,
    read one document at a time as a packer would commit them."""
    out: dict[int, list[tuple[str, int]]] = {}
    while True:
        block = stream.read_ahead()
        # The document's own epoch: documents skipped before it (too short) may end the
        # stream's current epoch, and a rotating stream's next ones may be empty.
        epoch, _ = stream._local(int(block.gpos[0]))
        if epoch >= stop:  # (a fresh stream may start at a later epoch)
            return out
        doc = (stream.access.path(int(block.file[0])), int(block.doc[0]))
        out.setdefault(epoch, []).append(doc)
        stream.commit(1)
        stream.rewind()


def check_rotating_passes(
    info: CorpusInfo, order: Any, n_shards: int, seed: int, line_tokens: int = 10**6
) -> dict:
    """Dataset ``"s"`` of ``info`` read by ``order`` in each of ``n_shards`` logical shards as
    a rotating stream (by default a budget of 10**6 tokens per line): each pass over the
    shards (epoch ``e`` of every shard) covers every document the writer wrote exactly once
    (G4), for ``n_shards + 2`` passes. Returns the passes, ``{epoch: [(file path, doc), ...]}``."""
    access = accesses(info)[0]
    ref = sorted((path, d) for _, path, d in writer_order(info, "s"))
    passes: dict[int, list[tuple[str, int]]] = {}
    for sid in range(n_shards):
        stream = order(access, sid, n_shards, seed, Decoration(), line_tokens)
        assert stream.size == len(ref) and stream.rotating
        for epoch, got in documents_by_epoch(stream, n_shards + 2).items():
            passes.setdefault(epoch, []).extend(got)
    assert sorted(passes) == list(range(n_shards + 2))
    for epoch, got in passes.items():
        assert sorted(got) == ref, f"pass {epoch} does not cover every document once"
    return passes
