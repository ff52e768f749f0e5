"""One fms-fsdp logical shard's stream of document chunks, as an explicit state machine.

fms-fsdp (``StreamingDocDataset.__iter__``) walks its documents from where its state says
(``docset_index``, with ``lcg_state`` and ``chunk_index``), mapping each position to a
document of the current file's range by a linear congruential walk
(``m = 2**ceil(log2(range))``, ``a = 5``, ``c = 2*(shard + seed) + 1``, redrawn until below
the range). Each document gets BOS (if set) and EOS and is cut into chunks of at most
1,024 tokens; documents of fewer than ``min_length`` tokens counting those yield nothing.
After one pass it yields the chunks it skipped at the start (those before the checkpoint)
and starts the next pass from the same place and LCG value: a pass always starts where the
stream was built or resumed. Two quirks kept for parity:

- a document empty after stripping is skipped *without* advancing the LCG, so the next
  positions in the same file draw the same empty document (logged once per file);
- the LCG state is updated only when the stream is asked for the chunk after a document's
  last one, so a state taken between them still names the finished document.

Where fms-fsdp would loop forever (a pass that yields nothing) this raises.

State keys: ``docset_index``, ``chunk_index``, ``lcg_state``, ``epochs_seen``,
``tokens_seen``, ``docs_seen``, ``percent_seen`` (fms-fsdp's fields and values) and
``origin`` (where the current pass started, with its LCG value, the chunks skipped in
its first document, how far it is, and whether anything was yielded), which fms-fsdp keeps
in its generator's locals; without it a resume is what fms-fsdp's resume is.
"""

from __future__ import annotations

import bisect
import logging
import math

import numpy as np

from fmsdata.errors import EmptyDatasetError, StateMismatchError

from .arrowdocs import ArrowDocs
from .layout import ShardDocs
from .spans import LIT, Segment

__all__ = ["CHUNK", "DocStream"]

logger = logging.getLogger(__name__)

CHUNK = 1024  # fms-fsdp's max_chunksize; get_data_loader never changes it


Chunk = tuple[list[Segment], int, int]  # segments, number of tokens, last token


class DocStream:
    """Chunks of one logical shard of one dataset, as spans (``spans``) with their size
    and last token."""

    FIELDS = (
        *("docset_index", "chunk_index", "lcg_state", "epochs_seen", "tokens_seen"),
        *("docs_seen", "percent_seen"),
    )

    def __init__(
        self,
        folder: str,
        name: str,
        docs: ShardDocs,
        shard: int,
        seed: int,
        reader: ArrowDocs,
        file_ids: dict[str, int],
        eos: int,
        bos: int | None,
        min_length: int = 3,
    ):
        self.folder, self.name, self.shard, self.seed = folder, name, shard, seed
        self.ranges = docs.ranges
        self.ends = np.cumsum([hi - lo + 1 for _, lo, hi in self.ranges]).tolist()
        self.n_docs = docs.n_docs
        self.reader, self.eos, self.bos, self.min_length = reader, eos, bos, min_length
        self.file_ids = file_ids
        self.docset_index, self.chunk_index, self.lcg_state = 0, -1, seed + shard
        self.epochs_seen, self.tokens_seen, self.docs_seen = -1, 0, 0
        self.percent_seen: float = 0
        self.origin: dict | None = None  # set on the first chunk asked for
        self._doc: tuple | None = None  # (tokens, n_chunks, next chunk, stop, lcg)
        self._warned: set[str] = set()

    # -- state -----------------------------------------------------------------
    def state(self) -> dict:
        out = {field: getattr(self, field) for field in self.FIELDS}
        out["dataset"] = self.name
        if self.origin is not None:
            out["origin"] = dict(self.origin)
        return out

    def load(self, state: dict) -> None:
        if state["dataset"] != self.name:
            raise StateMismatchError(
                f"logical shard {self.shard}: checkpoint holds dataset {state['dataset']!r}, "
                f"expected {self.name!r}"
            )
        for field in self.FIELDS:
            setattr(self, field, state[field])
        self.origin = dict(state["origin"]) if state.get("origin") else None
        self._doc = None
        if self.origin is not None and self.origin["phase"] != "start":
            self._reopen()

    # -- walk --------------------------------------------------------------------
    def _locate(self, index: int) -> tuple[str, int, int]:
        k = bisect.bisect_right(self.ends, index)
        name, lo, hi = self.ranges[k]
        return name, hi - lo + 1, lo

    def _lcg(self, size: int) -> int:
        m = 2 ** math.ceil(math.log2(size))
        c = (self.shard + self.seed) * 2 + 1
        state = self.lcg_state
        while True:
            state = (5 * state + c) % m
            if state < size:
                return state

    def _fetch(self, index: int) -> tuple[tuple[np.ndarray, int, int], int]:
        """``((stripped tokens, file id, document), lcg value)`` of position ``index``."""
        name, size, lo = self._locate(index)
        lcg = self._lcg(size)
        fid = self.file_ids[name]
        doc = self.reader.get(fid, lo + lcg)
        if len(doc) == 0 and name not in self._warned:
            self._warned.add(name)
            logger.warning(
                "%s/%s: document %d is empty after stripping; as in fms-fsdp, the positions "
                "of logical shard %d that follow in this file draw it again and are skipped",
                self.folder,
                name,
                lo + lcg,
                self.shard,
            )
        return (doc, fid, lo + lcg), lcg

    def _n_chunks(self, doc: tuple[np.ndarray, int, int]) -> int:
        n = len(doc[0]) + (1 if self.bos is None else 2)
        return 0 if n < self.min_length else math.ceil(n / CHUNK)

    def _chunk(self, doc: tuple[np.ndarray, int, int], j: int, n_chunks: int) -> Chunk:
        tokens, fid, index = doc
        start, n = j * CHUNK, CHUNK
        segs: list[Segment] = []
        if self.bos is not None:
            if j == 0:
                n -= 1
                segs.append((LIT, 0, 0, 1, self.bos))
            else:
                start -= 1
        n = max(0, min(n, len(tokens) - start))
        self.tokens_seen += n
        if n:
            segs.append((fid, index, start, n, int(tokens[start])))
        size = n + (self.bos is not None and j == 0)
        if j == n_chunks - 1:
            segs.append((LIT, 0, 0, 1, self.eos))
            return segs, size + 1, self.eos
        return segs, size, int(tokens[start + n - 1])

    def _reopen(self) -> None:
        """Rebuild the document being emitted after a load of fmsdata's own state."""
        o = self.origin
        assert o is not None
        doc, lcg = self._fetch(self.docset_index)
        n = self._n_chunks(doc)
        if o["phase"] == "main":
            self._doc = (doc, n, self.chunk_index + 1, n, lcg)
        else:  # "residual": the chunks skipped at the pass's start, no LCG step after them
            self._doc = (doc, n, self.chunk_index + 1, min(o["residual"], n), None)

    def next_chunk(self) -> Chunk:
        if self.origin is None:
            self.origin = {
                "index": self.docset_index,
                "lcg": self.lcg_state,
                "residual": self.chunk_index + 1,
                "i": 0,
                "phase": "start",
                "yielded": False,
                "pass_yielded": False,
            }
        o = self.origin
        while True:
            if self._doc is not None:
                doc, n, j, stop, lcg = self._doc
                if j < stop:
                    self._doc = (doc, n, j + 1, stop, lcg)
                    self.chunk_index = j
                    if o["phase"] == "main" and j == n - 1:
                        self.docs_seen += 1
                        self.percent_seen = self.docs_seen * 100 / (self.n_docs + 1e-9)
                    o["yielded"] = o["pass_yielded"] = True
                    return self._chunk(doc, j, n)
                self._doc = None
                if lcg is not None:
                    self.lcg_state = lcg
                if o["phase"] == "residual":
                    self._end_pass()
                    continue
            if self.n_docs == 0:
                raise EmptyDatasetError(
                    f"{self.folder}: logical shard {self.shard} owns no documents"
                )
            if o["phase"] == "start":
                o["phase"], o["i"] = "main", 0
            if o["phase"] == "main" and o["i"] < self.n_docs:
                i = o["i"]
                o["i"] += 1
                index = (o["index"] + i) % self.n_docs
                if index == 0:
                    self.epochs_seen += 1
                self.docset_index = index
                doc, lcg = self._fetch(index)
                if len(doc[0]) == 0:
                    continue
                n = self._n_chunks(doc)
                first = o["residual"] if i == 0 else 0
                self._doc = (doc, n, first, n, lcg)
                continue
            if o["phase"] == "main":
                # the pass is over: the chunks skipped at its start come now
                self.docset_index, self.lcg_state = o["index"], o["lcg"]
                o["phase"] = "residual"
                doc, _ = self._fetch(o["index"])
                if len(doc[0]) == 0:
                    self._end_pass(check=False)
                    continue
                n = self._n_chunks(doc)
                self._doc = (doc, n, 0, min(o["residual"], n), None)
                continue

    def _end_pass(self, check: bool = True) -> None:
        o = self.origin
        assert o is not None
        if check and not o["yielded"]:
            raise EmptyDatasetError(
                f"{self.folder}: logical shard {self.shard} has no document long enough "
                f"({self.min_length} tokens counting BOS/EOS); fms-fsdp stops with an "
                "'Empty logical shard' assertion"
            )
        if not o["pass_yielded"]:
            raise EmptyDatasetError(
                f"{self.folder}: a whole pass of logical shard {self.shard} yielded nothing "
                "(its first document is empty after stripping, so fms-fsdp skips every "
                "document of that file and loops forever); remove the empty document"
            )
        o["phase"], o["i"], o["pass_yielded"] = "main", 0, False
