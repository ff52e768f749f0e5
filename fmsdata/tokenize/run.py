"""A tokenize run: plan, skip what is done, run the rest on a backend, write the metadata.

Backends run the same ``tokenize_unit`` on the same plan: ``local`` (``workers``
processes on this machine, in-process for one) or ``ray`` (tasks on the Ray cluster of
``RAY_ADDRESS``, or a local Ray instance). The output directory must be visible to every
task under the same path. When every unit of the plan is done, whichever task finishes
last writes ``meta/counts.csv`` and ``metadata.json`` (same bytes from any of them); a
rerun of a finished run only rewrites those.
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import fcntl
import json
import multiprocessing
import os
import queue
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from fmsdata import __version__
from fmsdata.data.catalog import COUNTS_HEADER, META_DIR
from fmsdata.data.indexing import write_counts
from fmsdata.data.metadata import EOS_NAMES
from fmsdata.errors import ConfigError
from fmsdata.handlers.text import TextTokenizer
from fmsdata.tokenize.inputs import InputFile, find_inputs
from fmsdata.tokenize.plan import (
    EOS_FORMATS,
    TokenizeSpec,
    Unit,
    auto_shard_bytes,
    plan_document,
    plan_units,
    select_units,
)
from fmsdata.tokenize.work import (
    file_sha256,
    read_record,
    tokenize_unit,
    unit_done,
    write_json_atomic,
)
from fmsdata.tokenize.writers import MDS_COLUMN, mds_index
from fmsdata.util.extras import require

__all__ = ["TokenizeResult", "run_tokenize", "clear_dataset", "BACKENDS"]

BACKENDS = ("local", "ray")
METADATA = "metadata.json"


@dataclasses.dataclass
class TokenizeResult:
    """What one invocation did, and the run's totals once every unit is done."""

    units: int  # in the whole plan
    mine: int  # this task's units
    skipped: int  # this task's units already done
    written: list[dict[str, Any]]  # records of the units written now
    complete: bool  # every unit of the plan is done (metadata written)
    documents: int = 0  # whole run, when complete
    tokens: int = 0
    bad_records: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)


def run_tokenize(
    spec: TokenizeSpec,
    input_paths: Sequence[str],
    workers: int = 1,
    backend: str = "local",
    num_shards: int = 1,
    shard_id: int = 0,
    on_unit: Callable[[dict[str, Any]], None] = lambda record: None,
    on_plan: Callable[[list[Unit]], None] = lambda todo: None,
    on_progress: Callable[[int, int], None] = lambda documents, tokens: None,
    restart: bool = False,
) -> TokenizeResult:
    """Tokenize ``input_paths`` per ``spec``. ``on_plan(todo)`` is told the units about to
    run, ``on_progress(documents, tokens)`` the increments as they are encoded (per unit
    with Ray), and ``on_unit(record)`` of each unit written.

    A rerun with the same inputs and settings skips the finished shards. One with other
    settings is refused while the earlier run has shards done, unless ``restart``, which
    first deletes the dataset's earlier output (``clear_dataset``). A run that fails for
    finding no document (the wrong ``text_field``) keeps nothing, so the corrected rerun
    just runs."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers!r}")
    # Absolute paths: Ray workers and SLURM tasks may run in other folders.
    spec = dataclasses.replace(
        spec,
        output_dir=os.path.abspath(spec.output_dir),
        tokenizer=os.path.abspath(spec.tokenizer),
        eos_token=_eos_token(spec),
    )
    inputs = find_inputs([os.path.abspath(p) for p in input_paths])
    if spec.shard_bytes is None:
        spec = dataclasses.replace(spec, shard_bytes=auto_shard_bytes(inputs))
    assert spec.shard_bytes is not None
    units = plan_units(inputs, spec.shard_bytes)
    tokenizer_sha = file_sha256(spec.tokenizer)
    _root_metadata(spec, tokenizer_sha)  # refuse a root of another tokenizer before any work
    if restart:
        if num_shards > 1:
            raise ConfigError(
                "restart with several tasks (--num-shards) would delete each other's new "
                f"shards: delete the earlier output once before launching them "
                f"({_earlier_output(spec)})"
            )
        clear_dataset(spec)
    _claim(spec, plan_document(spec, inputs, units, tokenizer_sha))
    mine = select_units(units, num_shards, shard_id)
    todo = [u for u in mine if not unit_done(spec, u.index)]
    on_plan(todo)
    # Largest first, so the last unit to finish is a small one.
    todo.sort(key=lambda u: (-u.weight, u.index))
    if backend == "ray":
        written = _run_ray(spec, inputs, todo, on_unit, on_progress)
    else:
        written = _run_local(spec, inputs, todo, workers, on_unit, on_progress)
    result = TokenizeResult(len(units), len(mine), len(mine) - len(todo), written, False)
    if all(unit_done(spec, u.index) for u in units):
        records = [read_record(spec, u.index) for u in units]
        try:
            _refuse_no_documents(spec, records)
        except ConfigError:
            clear_dataset(spec)  # shards of nothing: the corrected rerun starts clean
            raise
        _finish(spec, inputs, records, tokenizer_sha)
        result.complete = True
        result.documents = sum(r["documents"] for r in records)
        result.tokens = sum(r["tokens"] for r in records)
        result.bad_records = _merge_bad(records)
    return result


def _eos_token(spec: TokenizeSpec) -> int | None:
    """The end-of-document token the format writes: given, or the tokenizer's EOS."""
    if spec.output_format not in EOS_FORMATS or spec.eos_token is not None:
        return spec.eos_token
    vocab = TextTokenizer(spec.tokenizer).tokenizer.get_vocab(with_added_tokens=True)
    for name in EOS_NAMES:
        if name in vocab:
            return int(vocab[name])
    raise ConfigError(
        f"--format {spec.output_format} writes an end-of-document token after every document, "
        f"and tokenizer {spec.tokenizer} has none of {', '.join(EOS_NAMES)}: pass --eos-token ID"
    )


def _claim(spec: TokenizeSpec, plan: dict[str, Any]) -> None:
    """Store the plan beside the output, or check it matches the one stored there. A stored
    plan of which no shard was finished (a run stopped before its first) is replaced."""
    path = os.path.join(spec.work_dir, "plan.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            stored = json.load(handle)
        if stored.get("fingerprint") == plan["fingerprint"]:
            return
        if _finished_units(spec):
            changed = sorted(k for k in plan if k != "fingerprint" and stored.get(k) != plan[k])
            raise ConfigError(
                f"dataset {spec.dataset!r} of {spec.output_dir} holds the output of another "
                f"tokenize run (its {', '.join(changed) or 'plan'} differ; see {path}): rerun "
                f"with --restart to delete it ({_earlier_output(spec)}) and start over, or "
                "use another --output-dir or --dataset"
            )
    write_json_atomic(path, plan)


def _finished_units(spec: TokenizeSpec) -> list[str]:
    """The unit records in the work folder (one per finished shard)."""
    if not os.path.isdir(spec.work_dir):
        return []
    return [n for n in os.listdir(spec.work_dir) if n.startswith("shard-") and n.endswith(".json")]


def _shard_files(spec: TokenizeSpec) -> list[str]:
    """The files tokenize writes in the dataset folder (shards, their sidecars, an MDS
    index), found there: what ``clear_dataset`` deletes."""
    folder = os.path.join(spec.output_dir, spec.dataset)
    if not os.path.isdir(folder):
        return []
    return sorted(
        os.path.join(folder, n)
        for n in os.listdir(folder)
        if n.startswith(("shard-", "shard.")) or n == "index.json"
    )


def _earlier_output(spec: TokenizeSpec) -> str:
    """What ``clear_dataset`` would delete, as the folders that exist."""
    found = []
    shards = _shard_files(spec)
    if shards:
        found.append(
            f"{len(shards)} shard file(s) in {os.path.join(spec.output_dir, spec.dataset)}"
        )
    if os.path.isdir(spec.work_dir):
        found.append(f"the run's records in {spec.work_dir}")
    return " and ".join(found) or "nothing is left of it"


def clear_dataset(spec: TokenizeSpec) -> None:
    """Delete what tokenize runs wrote for ``spec.dataset`` in ``spec.output_dir``: its
    shards (and sidecars), its work folder (plan and unit records), its rows of
    ``meta/counts.csv`` and its entry in ``metadata.json``. Other datasets of the root, and
    files in the dataset folder that tokenize does not write, are kept."""
    meta = os.path.join(spec.output_dir, "meta")
    os.makedirs(meta, exist_ok=True)
    with open(os.path.join(meta, ".tokenize.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for path in _shard_files(spec):
            os.remove(path)
        folder = os.path.join(spec.output_dir, spec.dataset)
        if os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
        shutil.rmtree(spec.work_dir, ignore_errors=True)
        counts = os.path.join(spec.output_dir, META_DIR, "counts.csv")
        if os.path.exists(counts):
            write_counts(spec.output_dir, _other_counts(spec))
        path = os.path.join(spec.output_dir, METADATA)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                metadata = json.load(handle)
            if spec.dataset in metadata.get("datasets", {}):
                del metadata["datasets"][spec.dataset]
                write_json_atomic(path, metadata)


def _run_local(
    spec: TokenizeSpec,
    inputs: Sequence[InputFile],
    todo: Sequence[Unit],
    workers: int,
    on_unit: Callable[[dict[str, Any]], None],
    on_progress: Callable[[int, int], None],
) -> list[dict[str, Any]]:
    written = []
    if workers == 1 or len(todo) <= 1:
        for unit in todo:
            written.append(tokenize_unit(spec, inputs, unit, on_progress))
            on_unit(written[-1])
        return written
    threads = str(max(1, (os.cpu_count() or 1) // workers))
    progress: multiprocessing.Queue = multiprocessing.Queue()

    def drain() -> None:
        while True:
            try:
                on_progress(*progress.get_nowait())
            except queue.Empty:
                return

    with concurrent.futures.ProcessPoolExecutor(
        workers, initializer=_start_worker, initargs=(threads, progress)
    ) as pool:
        pending = {pool.submit(tokenize_unit, spec, inputs, u, _queue_progress) for u in todo}
        while pending:
            done, pending = concurrent.futures.wait(
                pending, timeout=0.2, return_when=concurrent.futures.FIRST_COMPLETED
            )
            drain()
            for future in done:
                written.append(future.result())
                on_unit(written[-1])
    drain()
    return written


_progress_queue: multiprocessing.Queue | None = None


def _start_worker(threads: str, progress: multiprocessing.Queue) -> None:
    """Give each worker process its share of the cores for ``tokenizers``' thread pool,
    and the queue its progress goes to."""
    global _progress_queue
    os.environ["RAYON_NUM_THREADS"] = threads
    os.environ["RAYON_RS_NUM_THREADS"] = threads
    _progress_queue = progress


def _queue_progress(documents: int, tokens: int) -> None:
    if _progress_queue is not None:
        _progress_queue.put((documents, tokens))


def _run_ray(
    spec: TokenizeSpec,
    inputs: Sequence[InputFile],
    todo: Sequence[Unit],
    on_unit: Callable[[dict[str, Any]], None],
    on_progress: Callable[[int, int], None],
) -> list[dict[str, Any]]:
    """Ray tasks report when their unit is done (no live progress from inside them)."""
    ray = require("ray", "fmsdata tokenize --backend ray")
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
    task = ray.remote(num_cpus=1, max_retries=2)(tokenize_unit)
    pending = [task.remote(spec, inputs, unit) for unit in todo]
    written = []
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        written.append(ray.get(done[0]))
        on_progress(written[-1]["documents"], written[-1]["tokens"])
        on_unit(written[-1])
    return written


def _refuse_no_documents(spec: TokenizeSpec, records: Sequence[dict[str, Any]]) -> None:
    """A dataset without a single document is a mistake (most often the wrong
    ``text_field``), not an output: say what the records held instead of writing it up."""
    if any(r["documents"] for r in records):
        return
    problems: dict[str, int] = {}
    for per_file in _merge_bad(records).values():
        for what, n in per_file.items():
            problems[what] = problems.get(what, 0) + n
    empty = sum(r["empty_documents"] for r in records)
    found = [f"{n} record(s): {what}" for what, n in sorted(problems.items(), key=lambda p: -p[1])]
    if empty:
        found.append(f"{empty} record(s) whose text tokenized to nothing")
    raise ConfigError(
        f"dataset {spec.dataset!r}: 0 documents with text field {spec.text_field!r} in the "
        f"inputs ({'; '.join(found[:5]) or 'no records at all'}); "
        "set --text-field to the field holding the text"
    )


def _merge_bad(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    bad: dict[str, dict[str, int]] = {}
    for record in records:
        for path, problems in record["bad_records"].items():
            per_file = bad.setdefault(path, {})
            for what, n in problems.items():
                per_file[what] = per_file.get(what, 0) + n
    return bad


TOKENIZER_FILE = "tokenizer.json"


def tokenizer_info(path: str, sha256: str) -> dict[str, Any]:
    """What ``metadata.json`` says of the tokenizer; ``file`` is the copy in the root
    (relative to it), ``source_file`` the name of the file it was copied from."""
    tokenizer = TextTokenizer(path)
    added = tokenizer.tokenizer.get_added_tokens_decoder()
    return {
        "file": TOKENIZER_FILE,
        "source_file": os.path.basename(path),
        "sha256": sha256,
        "vocab_size": tokenizer.tokenizer.get_vocab_size(with_added_tokens=True),
        "special_tokens": {t.content: i for i, t in sorted(added.items()) if t.special},
        "dtype": tokenizer.dtype.name,
    }


def _finish(
    spec: TokenizeSpec,
    inputs: Sequence[InputFile],
    records: Sequence[dict[str, Any]],
    tokenizer_sha: str,
) -> None:
    """Write ``meta/counts.csv`` (other datasets' rows kept) and ``metadata.json``, under a
    lock: runs of other datasets into the same root may finish at the same time."""
    lock_path = os.path.join(spec.output_dir, "meta", ".tokenize.lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write_metadata(spec, inputs, records, tokenizer_sha)


def _write_metadata(
    spec: TokenizeSpec,
    inputs: Sequence[InputFile],
    records: Sequence[dict[str, Any]],
    tokenizer_sha: str,
) -> None:
    import tokenizers

    rows = [(r["shard"], r["documents"], r["tokens"]) for r in records if r["documents"]]
    write_counts(spec.output_dir, _other_counts(spec) + rows)
    hashes: dict[str, str] = {}
    for record in records:
        hashes.update(record["input_sha256"])
    path = os.path.join(spec.output_dir, METADATA)
    metadata = _root_metadata(spec, tokenizer_sha)
    metadata["fmsdata_version"] = __version__
    metadata["tokenizers_version"] = tokenizers.__version__
    _copy_tokenizer(spec)
    metadata["tokenizer"] = tokenizer_info(spec.tokenizer, tokenizer_sha)
    if spec.output_format == "mds":
        mds_index(os.path.join(spec.output_dir, spec.dataset), [r["mds_entry"] for r in records])
    col_name = {"arrow": spec.col_name, "mds": MDS_COLUMN}.get(spec.output_format)
    if spec.output_format == "flat":
        # tatm's get_dataset reads this block: files {file_prefix}*.{file_extension}.
        metadata["tokenized_info"] = {
            "tokenizer": metadata["tokenizer"]["source_file"],
            "file_prefix": os.path.join(spec.output_dir, spec.dataset, "shard-"),
            "file_extension": "bin",
            "dtype": metadata["tokenizer"]["dtype"],
            "vocab_size": metadata["tokenizer"]["vocab_size"],
            "tokenizers_version": tokenizers.__version__,
        }
    metadata.setdefault("datasets", {})[spec.dataset] = {
        "format": spec.output_format,
        "text_field": spec.text_field,
        "col_name": col_name,
        "eos_token": spec.eos_token if spec.output_format in EOS_FORMATS else None,
        "documents_end_with_eos": spec.output_format in EOS_FORMATS,
        "documents_start_with_bos": False,  # encoded without the tokenizer's special tokens
        "shards": len(records),
        "documents": sum(r["documents"] for r in records),
        "tokens": sum(r["tokens"] for r in records),
        "empty_documents": sum(r["empty_documents"] for r in records),
        "bad_records": _merge_bad(records),
        "inputs": [{"path": f.path, "bytes": f.size, "sha256": hashes[f.path]} for f in inputs],
    }
    write_json_atomic(path, metadata)


def _copy_tokenizer(spec: TokenizeSpec) -> None:
    """The tokenizer file into the root, so that the data decodes without it."""
    target = os.path.join(spec.output_dir, TOKENIZER_FILE)
    shutil.copyfile(spec.tokenizer, target + ".tmp")
    os.replace(target + ".tmp", target)


def _root_metadata(spec: TokenizeSpec, tokenizer_sha: str) -> dict[str, Any]:
    """The root's ``metadata.json`` (empty if none), checked to hold the same tokenizer."""
    path = os.path.join(spec.output_dir, METADATA)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        metadata = json.load(handle)
    known = metadata.get("tokenizer", {}).get("sha256")
    if known not in (None, tokenizer_sha):
        raise ConfigError(
            f"{path}: the other datasets of this root were tokenized with another "
            f"tokenizer (sha256 {known}, this one {tokenizer_sha}); use another --output-dir"
        )
    return metadata


def _other_counts(spec: TokenizeSpec) -> list[tuple[str, int, int]]:
    """Rows of ``meta/counts.csv`` that belong to other datasets of the root."""
    path = os.path.join(spec.output_dir, META_DIR, "counts.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != COUNTS_HEADER:
            raise ConfigError(f"{path}: not a counts file (header {header!r})")
        rows = []
        for row in reader:
            if row and not row[0].lstrip("/").startswith(spec.dataset + "/"):
                rows.append((row[0].lstrip("/"), int(row[1]), int(row[2])))
    return rows
