"""``fmsdata trace``: what global step N trained on, and at which steps a document was
delivered, from a run's config and a checkpoint (``fmsdata.trace``).

Spans only: the rows are told from the logical shards' chains replayed at span level; only
``--batch`` and ``--verify`` read the steps' tokens (and a token-level stage the tokens
its decision looks at).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from fmsdata.cli.parser import PathArg, add_command, positive_int
from fmsdata.cli.storage_options import add_storage_options, storage_from_args
from fmsdata.errors import ConfigError

__all__ = ["add_parser", "run", "parse_document"]

DESCRIPTION = (
    "Tell what a run delivered, without a global index and without reading tokens: every "
    "rank's rows of global step N (--step N: the N-th batch, after which loader.steps == N) "
    "and the document pieces each row holds, in order (dataset, file relative to "
    "data_path, document index, first token, token count) with what the loader inserted "
    "(BOS/EOS, BOL/EOL, FIM sentinels, padding); or every step, rank and row at which a "
    "document's tokens were delivered (--doc DATASET:FILE:DOC, up to --until N); or the "
    "tokens of step N (--batch), or a log of per-step digests checked against the data "
    "(--verify LOG.jsonl, written from batches of return_step_digest: true). Without "
    "--checkpoint the run starts as the config describes; with one, steps after it are "
    "told from it, and steps up to it from the start of the run it records, checked to "
    "reach it."
)
HELP = "what step N trained on; when a document was seen"


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = add_command(commands, "trace", run, HELP, DESCRIPTION)
    parser.add_argument(
        "--config", type=PathArg("local"), required=True, help="the run's loader config (YAML)"
    )
    parser.add_argument(
        "--checkpoint",
        type=PathArg("read"),
        help="a loader checkpoint of the run: a folder of loader_rank_*.fms files, a folder of "
        "automatic checkpoints (the newest complete step_* is read), a state file, or a local "
        "torch.distributed.checkpoint folder",
    )
    parser.add_argument("--step", type=positive_int, help="the global step to tell (from 1)")
    parser.add_argument(
        "--doc",
        metavar="DATASET:FILE:DOC",
        help="a document: dataset name, file (relative to data_path or to the dataset's "
        "folder, or its index in the dataset's sorted files) and document index in the file",
    )
    parser.add_argument(
        "--until",
        type=positive_int,
        help="with --doc, the last step to look at (default: the checkpoint's step)",
    )
    parser.add_argument(
        "--batch",
        action="store_true",
        help="with --step, the step's tokens: every rank's input_ids and labels, saved as "
        ".npy under --out, else printed (decoded when the root's metadata.json names its "
        "tokenizer)",
    )
    parser.add_argument(
        "--out",
        type=PathArg("local"),
        help="with --batch, the folder to write input_ids.npy and labels.npy to "
        "([world size, batch size, seq_length] each)",
    )
    parser.add_argument(
        "--verify",
        metavar="LOG.jsonl",
        type=PathArg("local"),
        help='a log of per-step digests ({"step", "rank", "digest"}, {"step", '
        '"digests"} or {"step", "digest"} per line): derive each step\'s batches from the '
        "data and name the first step that differs",
    )
    parser.add_argument(
        "--world-size",
        type=positive_int,
        help="ranks of the run after the checkpoint (default: the checkpoint's; without one, "
        "global_batch_size / batch_size)",
    )
    parser.add_argument(
        "--stages",
        metavar="MODULE:FUNCTION",
        help="the run's chain of stages when it is not the default: the function passed as "
        "build_dataloader(stages=...), imported from MODULE",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (one object)")
    add_storage_options(parser)


def parse_document(text: str) -> tuple[str, str, int]:
    """``DATASET:FILE:DOC`` as (dataset, file, doc).

    Raises:
        ConfigError: Not three fields, or DOC not an integer.
    """
    dataset, _, rest = text.partition(":")
    file, _, doc = rest.rpartition(":")
    if not dataset or not file or not doc.isdigit():
        raise ConfigError(
            f"--doc takes DATASET:FILE:DOC (e.g. web:web/part-00017.arrow:42), got {text!r}"
        )
    return dataset, file, int(doc)


def run(args: argparse.Namespace) -> int:
    from fmsdata.cli.state import read_states, stage_factory
    from fmsdata.trace import Tracer

    modes = [name for name in ("step", "doc", "verify") if getattr(args, name) is not None]
    if len(modes) != 1:
        raise ConfigError(
            "fmsdata trace: give one of --step N, --doc DATASET:FILE:DOC, --verify LOG"
        )
    if args.batch and args.step is None:
        raise ConfigError("--batch tells the tokens of --step N: give --step")
    if args.out and not args.batch:
        raise ConfigError("--out is where --batch writes the step's tokens: give --batch")
    if args.until is not None and args.doc is None:
        raise ConfigError("--until bounds the steps --doc looks at: give --doc")
    states = None
    if args.checkpoint:
        _, states = read_states(args.checkpoint, storage_from_args(args))
    factory = stage_factory(args.stages) if args.stages else None
    tracer = Tracer(args.config, checkpoint=states, world_size=args.world_size, stages=factory)
    if args.verify is not None:
        return _verify(tracer, args)
    if args.doc is not None:
        return _document(tracer, args)
    if args.batch:
        return _batch(tracer, args)
    told = tracer.step(args.step).to_plain()
    if args.json:
        print(json.dumps(told, indent=1))
    else:
        _print_step(told)
    return 0


def _print_step(told: dict[str, Any]) -> None:
    print(
        f"step {told['step']}: {told['world_size']} rank(s), {len(told['rows'])} rows, "
        f"told from {told['from']}"
    )
    if told.get("checked"):
        print(f"checked: {told['checked']}")
    if told["skipped"]:
        skip = told["skip"]
        print(
            f"skipped: a skip of {skip['steps']} step(s) at step {skip['at']} passed over this "
            "step; its rows were consumed and not trained on:"
        )
    if told.get("not_followed"):
        print(
            "not exact: the trace cannot follow the token stage(s) "
            f"{', '.join(told['not_followed'])}; rows are told as they were before them"
        )
    for row in told["rows"]:
        print(
            f"\nrank {row['rank']} row {row['row']} (logical shard {row['shard']}, its line "
            f"{row['line']}): {row['content']} tokens before padding"
        )
        for at, text in sorted(_row_lines(row)):
            print(f"  {at:>6}  {text}")
        for gone in row.get("dropped", []):
            for piece in gone["pieces"]:
                print(f"  dropped by {gone['by']}: {_piece_text(piece)}")


def _row_lines(row: dict[str, Any]) -> list[tuple[int, str]]:
    """``(position, what)`` of each part of a row."""
    lines = [(p["at"], _piece_text(p)) for p in row["pieces"]]
    for p in row["inserted"]:
        times = f" x{p['length']}" if p["length"] > 1 else ""
        lines.append((p["at"], f"{p['kind']}{times} (token {p['token']})"))
    return lines


def _tokens_text(p: dict[str, Any]) -> str:
    return f"tokens {p['start']}..{p['start'] + p['length'] - 1} ({p['length']})"


def _piece_text(p: dict[str, Any]) -> str:
    role = f" [{p['role']}]" if p.get("role") else ""
    return f"{p['dataset']}  {p['file']}  doc {p['doc']}  {_tokens_text(p)}{role}"


def _document(tracer: Any, args: argparse.Namespace) -> int:
    dataset, file, doc = parse_document(args.doc)
    found = tracer.document(dataset, file, doc, until=args.until).to_plain()
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    d = found["document"]
    print(
        f"document {d['doc']} of {d['file']} (dataset {d['dataset']}), steps 1 to "
        f"{found['until']}, logical shard(s) {found['shards']}"
    )
    if found.get("checked"):
        print(f"checked: {found['checked']}")
    if not found["seen"]:
        print("not delivered in these steps")
    for entry in found["seen"]:
        print(_seen_text(entry))
    for entry in found["passed_over"]:
        print(_seen_text(entry) + "  (in a skipped step: not trained on)")
    for entry in found["dropped"]:
        print(_seen_text(entry) + f"  (dropped by {entry['by']})")
    if found.get("not_followed"):
        print(f"not exact: the trace cannot follow {', '.join(found['not_followed'])}")
    return 0


def _seen_text(entry: dict[str, Any]) -> str:
    at = f" at {entry['at']}" if "at" in entry else ""
    where = f"step {entry['step']:>8}  rank {entry['rank']:>4}  row {entry['row']:>4}"
    return f"{where}  {_tokens_text(entry)}{at}"


def _batch(tracer: Any, args: argparse.Namespace) -> int:
    import numpy as np

    trace = tracer.step(args.step, tokens=True)
    if trace.batches is None:
        raise ConfigError(f"step {args.step} was skipped: it delivered no tokens")
    inputs = np.stack([b["input_ids"] for b in trace.batches])
    labels = np.stack([b["labels"] for b in trace.batches])
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        np.save(os.path.join(args.out, "input_ids.npy"), inputs)
        np.save(os.path.join(args.out, "labels.npy"), labels)
        shape = list(inputs.shape)
        if args.json:
            print(json.dumps({"step": args.step, "out": args.out, "shape": shape}))
        else:
            print(f"step {args.step}: input_ids and labels {shape} written to {args.out}")
        return 0
    if args.json:
        tokens = {"input_ids": inputs.tolist(), "labels": labels.tolist()}
        print(json.dumps({"step": args.step, **tokens}))
        return 0
    tokenizer = _root_tokenizer(tracer.origin_of(args.step).config)
    how = "decoded with the root's tokenizer" if tokenizer else "token ids"
    print(f"step {args.step}: input_ids of {len(inputs)} rank(s) x {inputs.shape[1]} rows, {how}")
    for rank, rows in enumerate(inputs):
        for row, ids in enumerate(rows.tolist()):
            shown = tokenizer.decode(ids) if tokenizer else " ".join(map(str, ids))
            print(f"\nrank {rank} row {row}:\n{shown}")
    return 0


def _root_tokenizer(config: Any) -> Any:
    """The tokenizer the data root's ``metadata.json`` names, when it is a local file."""
    from fmsdata.data.metadata import read_metadata
    from fmsdata.handlers.text import TextTokenizer
    from fmsdata.remote.storage import Storage, is_local

    root = config.data_path
    storage = Storage.from_config(config.remote)
    meta = read_metadata(root, storage) or {}
    relative = (meta.get("tokenizer") or {}).get("file")
    if not relative:
        return None
    fs, path = storage.filesystem(f"{root.rstrip('/')}/{relative}")
    if not is_local(fs) or not fs.isfile(path):
        return None
    return TextTokenizer(path)


def _verify(tracer: Any, args: argparse.Namespace) -> int:
    from fmsdata.trace import read_digest_log, verify_digests

    report = verify_digests(tracer, read_digest_log(args.verify))
    if args.json:
        print(json.dumps(report.to_plain()))
    elif report.ok:
        print(f"{report.checked} logged step(s) match the batches the data gives: exact")
    else:
        detail = f" (logged {report.logged}, derived {report.derived})" if report.logged else ""
        print(f"first difference at step {report.step}: {report.reason}{detail}")
        print(f"{report.checked} logged step(s) before it match")
    return 0 if report.ok else 1
