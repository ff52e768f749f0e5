"""What the trace tests share: the rows a trace tells, rebuilt from the generated corpus's
own record of its tokens (``CorpusInfo.files``: the first token value and length of every
document), compared with the batches the loaders delivered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from support import corpus, take

from fmsdata import build_dataloader
from fmsdata.data.synthetic import CorpusInfo, write_corpus
from fmsdata.stages.outputs import IGNORE_INDEX


def expected_line(row: dict[str, Any], info: CorpusInfo) -> np.ndarray:
    """A told row's tokens: each piece's stored tokens from the corpus record (token
    values are consecutive per document), each inserted run's token id; pieces and
    inserted runs must tile the row from position 0."""
    items = [(p["at"], p) for p in row["pieces"]] + [(p["at"], p) for p in row["inserted"]]
    out: list[int] = []
    for at, piece in sorted(items, key=lambda item: item[0]):
        assert at == len(out), ("parts do not tile the row", row)
        if "token" in piece:
            out.extend([piece["token"]] * piece["length"])
        else:
            firsts, lengths = info.files[piece["file"]]
            assert piece["start"] + piece["length"] <= int(lengths[piece["doc"]]), piece
            first = int(firsts[piece["doc"]]) + piece["start"]
            out.extend(range(first, first + piece["length"]))
    return np.array(out, dtype=np.int64)


def assert_row_delivered(row: dict[str, Any], batch: dict[str, Any], info: CorpusInfo) -> None:
    """The told row is the delivered row: inputs token for token, labels shifted with
    the padding ignored."""
    line = expected_line(row, info)
    inputs = batch["input_ids"][row["row"]].numpy()
    labels = batch["labels"][row["row"]].numpy()
    seq = len(inputs)
    assert len(line) == seq + 1, (len(line), seq)
    assert np.array_equal(inputs, line[:seq]), (row, inputs.tolist(), line.tolist())
    keep = min(max(row["content"] - 1, 0), seq)
    want = line[1:].copy()
    want[keep:] = IGNORE_INDEX
    assert np.array_equal(labels, want), (row, labels.tolist(), want.tolist())


def assert_step_delivered(
    told: dict[str, Any], batches: Sequence[dict[str, Any]], info: CorpusInfo
) -> None:
    """Every row of every rank of a step, as told, is what was delivered."""
    assert told["world_size"] == len(batches)
    assert not told["skipped"] and told["exact"], told
    rows = {(r["rank"], r["row"]) for r in told["rows"]}
    size = len(batches[0]["input_ids"])
    assert rows == {(rank, i) for rank in range(len(batches)) for i in range(size)}
    for row in told["rows"]:
        assert_row_delivered(row, batches[row["rank"]], info)


def rank_batches(
    config: dict[str, Any], world_size: int, steps: int, stages: Any = None
) -> list[list[dict[str, Any]]]:
    """Each rank's first ``steps`` batches (per step: every rank's)."""
    per_rank = [
        take(build_dataloader(config, rank=r, world_size=world_size, stages=stages), steps)
        for r in range(world_size)
    ]
    return [[per_rank[r][s] for r in range(world_size)] for s in range(steps)]


def deliveries(
    steps: Sequence[Sequence[dict[str, Any]]], info: CorpusInfo, path: str, doc: int, first: int = 1
) -> list[dict[str, int]]:
    """Where the delivered batches hold document ``doc`` of ``path``: per step (counting
    from ``first``), rank and row, each run of its consecutive tokens in the row (inputs
    plus the last label), as ``{"step", "rank", "row", "start", "length", "at"}``."""
    firsts, lengths = info.files[path]
    lo, n = int(firsts[doc]), int(lengths[doc])
    found = []
    for s, batches in enumerate(steps, first):
        for rank, batch in enumerate(batches):
            lines = np.concatenate(
                [batch["input_ids"].numpy(), batch["labels"][:, -1:].numpy()], axis=1
            )
            for i, line in enumerate(lines):
                inside = (line >= lo) & (line < lo + n)
                at = 0
                while at < len(line):
                    if not inside[at]:
                        at += 1
                        continue
                    end = at
                    while (
                        end + 1 < len(line) and inside[end + 1] and line[end + 1] == line[end] + 1
                    ):
                        end += 1
                    found.append(
                        {
                            "step": s,
                            "rank": rank,
                            "row": i,
                            "start": int(line[at]) - lo,
                            "length": end - at + 1,
                            "at": at,
                        }
                    )
                    at = end + 1
    return found


def corpus_with_tiny(root: Any) -> CorpusInfo:
    """The default test corpus (datasets ``a``, ``b``) and ``tiny``: 3 documents of a few
    tokens, fewer than a line per logical shard, so it rotates over the shards."""
    info = corpus(root)
    end = max(end for _, end in info.ranges.values())
    tiny = write_corpus(root, {"tiny": 1}, docs_per_file=3, mean_length=6, first_token=end)
    return CorpusInfo(
        root=info.root,
        ranges={**info.ranges, **tiny.ranges},
        documents={**info.documents, **tiny.documents},
        files={**info.files, **tiny.files},
    )
