"""Shared test helpers: tiny corpora, loaders, the resume checker and coverage accounting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

import fmsdata.transport.rounds
from fmsdata import build_dataloader
from fmsdata.data.catalog import discover
from fmsdata.data.synthetic import CorpusInfo, write_corpus
from fmsdata.handlers import ArrowDocHandler
from fmsdata.stages.savedchain import held_spans, saved_stages, stage_state
from fmsdata.stages.savedlines import unpack_lines
from fmsdata.state.file import load_state, save_state, state_from_bytes, state_to_bytes

FIRST_TOKEN = 16  # corpus token values start here; smaller ids are special tokens
BOS, EOS, BOL, EOL, PAD = 1, 2, 3, 4, 5

Batch = dict[str, torch.Tensor]


# Set by conftest to a folder under pytest's base temp folder (pytest prunes old runs').
SCRATCH_ROOT: str | None = None


def scratch_dir() -> str:
    """A fresh empty folder, for what ``tmp_path`` cannot give: one per hypothesis example
    (``tmp_path`` is shared by a test's examples) or a corpus cached across tests. It lives
    under pytest's base temp folder, so no run leaves folders in the system temp dir."""
    if SCRATCH_ROOT is None:
        raise RuntimeError("scratch_dir() is for tests: conftest sets SCRATCH_ROOT")
    return tempfile.mkdtemp(dir=SCRATCH_ROOT)


def corpus(
    root: str | os.PathLike[str], files: dict[str, int] | None = None, **kwargs: Any
) -> CorpusInfo:
    """A small generated corpus (defaults: two datasets, short documents)."""
    kwargs.setdefault("docs_per_file", 24)
    kwargs.setdefault("mean_length", 40)
    return write_corpus(root, files or {"a": 3, "b": 2}, first_token=FIRST_TOKEN, **kwargs)


def base_config(info: CorpusInfo, **overrides: Any) -> dict[str, Any]:
    """A loader config over ``info`` with every stage on, overridable."""
    config: dict[str, Any] = dict(
        data_path=info.root,
        datasets=list(info.ranges),
        weights=[2.0, 1.0][: len(info.ranges)] + [1.0] * max(0, len(info.ranges) - 2),
        seq_length=32,
        batch_size=4,
        logical_shards=4,
        shuffle_window=6,
        seed=7,
        bos_token=BOS,
        eos_token=EOS,
        num_workers=0,
    )
    config.update(overrides)
    return config


def small_items(
    monkeypatch: Any,
    tokens: int = 4 * 33 * 2,
    kept: int | None = None,
    per_round: int | None = None,
) -> None:
    """Worker items of about ``tokens`` tokens of a worker's rows (two batches at the
    default seq 32, batch 4), so the batch ring and rounds of items turn within a few
    batches; ``kept``: batches the caller may keep without workers; ``per_round``: items a
    round. DataLoader workers are forked: they see the same sizes."""
    monkeypatch.setattr(fmsdata.transport.rounds, "_ITEM_TOKENS", tokens)
    if kept is not None:
        monkeypatch.setattr(fmsdata.transport.rounds, "_KEPT_BATCHES", kept)
    if per_round is not None:
        monkeypatch.setattr(fmsdata.transport.rounds, "_ITEMS_PER_ROUND", per_round)


def take(loader: Iterable[Batch], n: int) -> list[Batch]:
    out = []
    if n == 0:
        return out
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def assert_same_batches(expected: Sequence[Batch], actual: Sequence[Batch]) -> None:
    assert len(expected) == len(actual), (len(expected), len(actual))
    for i, (a, b) in enumerate(zip(expected, actual)):
        assert a.keys() == b.keys(), (i, a.keys(), b.keys())
        for key in a:
            assert torch.equal(a[key], b[key]), f"batch {i} differs in {key!r}"


def roundtrip(state: Any) -> Any:
    """A state as it comes back from a state file (checks it is plain data)."""
    return state_from_bytes(state_to_bytes(state))


def check_resume(build: Callable[[], Any], total: int, points: Iterable[int]) -> None:
    """Save after k batches for each k in ``points``, load into a fresh loader, and check the
    continuation equals the uninterrupted run token for token."""
    reference = take(build(), total)
    for k in points:
        first = build()
        assert_same_batches(reference[:k], take(first, k))
        state = roundtrip(first.snapshot())
        resumed = build()
        resumed.load_state_dict(state)
        assert_same_batches(reference[k:], take(resumed, total - k))


def run_in_fresh_process(
    config: dict[str, Any], state_path: str, n: int, out_path: str
) -> list[Batch]:
    """Resume from a state file in a new Python process and return its next ``n`` batches."""
    script = (
        "import json, sys, torch\n"
        "from fmsdata import build_dataloader\n"
        "from fmsdata.state.file import load_state\n"
        "config, state_path = json.loads(sys.argv[1]), sys.argv[2]\n"
        "n, out = int(sys.argv[3]), sys.argv[4]\n"
        "loader = build_dataloader(config)\n"
        "loader.load_state_dict(load_state(state_path))\n"
        "batches = []\n"
        "for batch in loader:\n"
        "    batches.append(batch)\n"
        "    if len(batches) == n: break\n"
        "torch.save(batches, out)\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, json.dumps(config), state_path, str(n), out_path],
        check=True,
        timeout=300,
    )
    return torch.load(out_path, weights_only=True)


def save_and_load(state: Any, path: str) -> Any:
    save_state(path, state)
    return load_state(path)


# -- coverage accounting ----------------------------------------------------------------


class Ledger:
    """Counts corpus token values seen in batches and in saved buffers (coverage checks).

    Works for configs without ``strip_tokens``: a document's content is its stored tokens.
    """

    def __init__(self, info: CorpusInfo, config: dict[str, Any]):
        self.info = info
        self.first = FIRST_TOKEN
        self.end = max(end for _, end in info.ranges.values())
        self.counts = np.zeros(self.end - self.first, dtype=np.int64)
        self.has_bos = config.get("bos_token") is not None
        self.config = dict(config)
        catalog = discover(
            info.root, config.get("datasets"), ArrowDocHandler(config.get("col_name", "tokens"))
        )
        self.paths = [list(ds.paths) for ds in catalog.datasets]

    def rotation(self, ds: int, n_shards: int) -> np.ndarray | None:
        """The portion order of dataset ``ds`` when it rotates, else None. Whether it rotates
        is the stream's own decision (a function of the data and the config); the order is
        the documented keyed permutation of the shards (the identity when sequential)."""
        from fmsdata.stages.documents import Decoration, stream_class
        from fmsdata.util.permute import derive_key, permute

        name = list(self.info.ranges)[ds]
        decoration = Decoration(
            bos=self.config.get("bos_token"),
            eos=self.config.get("eos_token"),
            min_length=self.config.get("min_length", 1),
        )
        order = self.config.get("document_order", "random")
        seed = self.config.get("seed", 42)
        line = self.config.get("seq_length", 4096) + 1
        access = accesses(self.info, [name], self.config.get("col_name", "tokens"))[0]
        stream = stream_class(order)(access, 0, n_shards, seed, decoration, line)
        if not stream._rotates():
            return None
        if order == "sequential":
            return np.arange(n_shards)
        return permute(np.arange(n_shards), n_shards, derive_key(seed, name, "portions"))

    def add_batches(self, batches: Iterable[Batch]) -> None:
        for batch in batches:
            # A line is the inputs plus the last target (the shift drops it from the inputs).
            last = batch["labels"][:, -1:]
            tokens = torch.cat([batch["input_ids"], last], dim=1).numpy().ravel()
            self.add_tokens(tokens[tokens >= self.first])

    def add_tokens(self, tokens: np.ndarray) -> None:
        np.add.at(self.counts, tokens - self.first, 1)

    def span_tokens(self, ds: int, file: int, doc: int, start: int, length: int) -> np.ndarray:
        """The corpus tokens of a saved span (length 0: to the end of the document)."""
        firsts, lengths = self.info.files[self.paths[ds][file]]
        size = int(lengths[doc])
        lo = max(start - self.has_bos, 0)
        hi = size if length == 0 else min(start + length - self.has_bos, size)
        return np.arange(int(firsts[doc]) + lo, int(firsts[doc]) + max(hi, lo), dtype=np.int64)

    def add_state(self, state: dict[str, Any], every_stage: bool = False) -> None:
        """Count the tokens held inside a rank state: buffered lines and packer carries
        (with ``every_stage``, or a packer other than ``LinePacker``, whose state holds no
        carry: whatever any stage of the recorded chain holds, asked of each stage type's
        ``held_spans``)."""
        for entry in state["shards"]:
            if entry["state"] is None:
                continue
            packer = stage_state(entry["state"], state["fingerprint"], "packer")
            if every_stage or "carry" not in packer:
                for row in _held_by_every_stage(entry["state"], state["fingerprint"]).tolist():
                    self.add_tokens(self.span_tokens(*row))
                continue
            shuffle = stage_state(entry["state"], state["fingerprint"], "shuffle")
            for row in unpack_lines(shuffle["buffer"]).held().tolist():
                self.add_tokens(self.span_tokens(*row))
            # One span as a rule; after a change of seq_length, the pieces to pack first.
            for span in np.asarray(packer["carry"], dtype=np.int64).reshape(-1, 5).tolist():
                self.add_tokens(self.span_tokens(*span))

    def dataset_tokens(self, name: str) -> np.ndarray:
        first, end = self.info.ranges[name]
        return self.counts[first - self.first : end - self.first]


def _held_by_every_stage(shard_state: dict[str, Any], fingerprint: dict[str, Any]) -> np.ndarray:
    """The spans every stage of the recorded chain holds in a shard state, each asked of its
    own part by its class (``fmsdata.stages.savedchain``)."""
    return held_spans(saved_stages(fingerprint["stages"], shard_state["stages"]))


def rank_loaders(config: dict[str, Any], world_size: int, **overrides: Any) -> list[Any]:
    return [
        build_dataloader({**config, **overrides}, rank=r, world_size=world_size)
        for r in range(world_size)
    ]


def global_steps(loaders: Sequence[Any], n_steps: int) -> list[list[tuple[int, ...]]]:
    """Per global step, the sorted list of sequences (as tuples) across ranks."""
    per_rank = [take(loader, n_steps) for loader in loaders]
    steps = []
    for s in range(n_steps):
        rows = []
        for batches in per_rank:
            rows.extend(tuple(r) for r in batches[s]["input_ids"].tolist())
        steps.append(sorted(rows))
    return steps


def accesses(
    info: CorpusInfo,
    datasets: Sequence[str] | None = None,
    col_name: str = "tokens",
    cache: Any = None,
) -> list[Any]:
    """Dataset accesses for stage-level tests (one shared reader cache: ``cache``, or one
    of 64 readers)."""
    from fmsdata.data.access import ReaderCache, make_accesses
    from fmsdata.remote.cache import LocalFiles

    handler = ArrowDocHandler(col_name)
    catalog = discover(info.root, datasets, handler)
    cache = ReaderCache(64) if cache is None else cache
    return make_accesses(catalog, handler, LocalFiles(catalog.root), cache)


def delivered_truth(info, config, batches):
    """Per dataset, tokens and whole documents in ``batches``, counted from token values."""
    ledger = Ledger(info, config)
    ledger.add_batches(batches)
    assert ledger.counts.max() <= 1, "the test expects no document twice (one epoch)"
    truth = {}
    for d, name in enumerate(info.ranges):
        docs = 0
        for path in ledger.paths[d]:
            firsts, lengths = info.files[path]
            for first, length in zip(firsts.tolist(), lengths.tolist()):
                seen = ledger.counts[first - FIRST_TOKEN : first + length - FIRST_TOKEN]
                docs += int(seen.all())
        truth[name] = {"tokens": int(ledger.dataset_tokens(name).sum()), "docs": docs}
    return truth


def check_exactly_once_per_epoch(
    ledger: Ledger, states: Sequence[dict[str, Any]], n_shards: int
) -> None:
    """G4 accounting: with ``states`` settled (advance 0) and the ledger holding every
    emitted batch plus those states, each document of a logical shard is seen exactly
    ``epoch`` times, or once more if the shard's walk passed it in the current epoch.

    A small dataset that rotates (docs/guide/document-order.md) reads, in epoch ``e``, the
    portion of shard ``order[(at + e) % n_shards]`` (``order[at]`` the shard itself): each
    portion's documents are then seen once for every completed epoch any shard spent on it,
    and the documents seen once more than that add up to the positions of the shards
    partway through it."""
    from fmsdata.stages.documents import all_fragments, shard_fragments

    entries = {e["id"]: e for state in states for e in state["shards"]}
    fingerprint = states[0]["fingerprint"]
    assert sorted(entries) == list(range(n_shards))
    for ds, name in enumerate(ledger.info.ranges):
        files = [ledger.info.files[p] for p in ledger.paths[ds]]
        counts = np.array([len(firsts) for firsts, _ in files])
        walks = {}
        for sid in range(n_shards):
            entry = entries[sid]
            assert entry["advance"] == 0, "settle the states first"
            mixer = stage_state(entry["state"], fingerprint, "mixer")
            stream = mixer["sources"][name] if mixer else None
            walks[sid] = (stream["epoch"], stream["pos"]) if stream else (0, 0)

        def seen_of(rows: np.ndarray, files: list = files, name: str = name) -> np.ndarray:
            per_doc = []
            for f, lo, hi in rows.tolist():
                firsts, lengths = files[f]
                for d in range(lo, hi):
                    seen = ledger.counts[
                        firsts[d] - ledger.first : firsts[d] + lengths[d] - ledger.first
                    ]
                    assert (seen == seen[0]).all(), f"document {d} of {name} partly emitted"
                    per_doc.append(int(seen[0]))
            return np.array(per_doc, dtype=np.int64)

        order = ledger.rotation(ds, n_shards)
        if order is None:
            for sid, (epoch, pos) in walks.items():
                per_doc = seen_of(shard_fragments(counts, n_shards, sid))
                assert set(per_doc.tolist()) <= {epoch, epoch + 1}, (
                    name,
                    sid,
                    epoch,
                    sorted(set(per_doc.tolist())),
                )
                assert int((per_doc == epoch + 1).sum()) == pos, (name, sid, pos)
            continue
        rows, owner = all_fragments(counts, n_shards)
        at = {int(q): i for i, q in enumerate(order)}
        full = np.zeros(n_shards, dtype=np.int64)  # completed epochs spent on each portion
        partial: dict[int, list[int]] = {q: [] for q in range(n_shards)}
        for sid, (epoch, pos) in walks.items():
            for e in range(epoch):
                full[order[(at[sid] + e) % n_shards]] += 1
            if pos:
                partial[int(order[(at[sid] + epoch) % n_shards])].append(pos)
        for q in range(n_shards):
            per_doc = seen_of(rows[owner == q]) - full[q]
            assert per_doc.min(initial=0) >= 0, (name, "portion", q, per_doc.tolist())
            assert per_doc.max(initial=0) <= len(partial[q]), (name, "portion", q)
            assert int(per_doc.sum()) == sum(partial[q]), (name, "portion", q, partial[q])


def run_torchrun(script: str, ranks: int, args: Sequence[str], cwd: str, timeout: int) -> str:
    """Run ``script`` under ``torchrun --nproc_per_node ranks`` (one thread per rank);
    its stdout, or a failed assertion showing the tails of both streams."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [*command, script, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout
