"""A new document order as one subclass: shuffled files, each read in stored order.

fmsdata's default order is a seeded random walk (``RandomWalk``): each logical shard reads
its fragments of files in a keyed random order, and the documents inside each in another.
Some runs want locality instead — each file read front to back (documents of a file that
belong together stay together; a remote root streams each file once), while the order of
the files still changes every epoch. That is one ``DocumentStream`` subclass with one
method, ``walk_order``: the fragment order of a cycle, and no per-fragment keys (stored
order inside each fragment).

Everything else is the stream's: which documents fall to which logical shard, epochs,
small datasets, skipping short documents, the state and its checks. So resume, rescale
to another number of ranks and ``fmsdata state show`` work unchanged. Run it (no
downloads; it writes a small corpus first):

    python examples/custom_order.py

It reads a few batches in the new order, checks that each file's documents come in stored
order, that a fresh loader resumes with exactly the batches that followed, that the state
saved by two ranks continues on one rank with exactly the same global steps, and that a
state saved with the default order is refused (the order is in the state's fingerprint).
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch

from fmsdata import build_dataloader
from fmsdata.data.synthetic import write_corpus
from fmsdata.errors import StateMismatchError
from fmsdata.stages import DocumentStream, Stage, WalkOrder
from fmsdata.stages.shard import Shard, default_stages
from fmsdata.util.permute import derive_key, permute


class FileShuffle(DocumentStream):
    """Fragments (pieces of files) in a new keyed order each epoch, documents in stored
    order inside each. The key depends only on (seed, dataset, shard, cycle): never on rank,
    world size or worker, which is what keeps resume and rescale exact."""

    def walk_order(self, fragments: np.ndarray, cycle: int) -> WalkOrder:
        n = len(fragments)
        key = derive_key(self.seed, self.access.name, self.shard, "files", cycle)
        return WalkOrder(order=permute(np.arange(n), n, key), keys=None)


def file_shuffled(shard: Shard) -> Stage:
    """The default chain with ``FileShuffle`` as every dataset's order (a module-level
    function: DataLoader workers receive it pickled)."""
    return shard.shuffle(shard.pack(shard.documents(FileShuffle)))


def take(loader, n: int) -> list[dict]:
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b)
    )


def global_rows(per_rank: list[list[dict]]) -> list[list[tuple[int, ...]]]:
    """Per global step, the sorted rows of every rank (world-size-invariant content)."""
    steps = []
    for s in range(len(per_rank[0])):
        steps.append(
            sorted(tuple(r) for batches in per_rank for r in batches[s]["input_ids"].tolist())
        )
    return steps


def files_in_stored_order(batches: list[dict], info) -> bool:
    """Without a shuffle buffer, each file's documents arrive in stored order: the corpus
    numbers tokens by document, so a file's documents come in increasing first tokens."""
    first_of = {}  # token -> (file, document index) of the document it starts
    for path, (firsts, _) in info.files.items():
        for d, token in enumerate(np.asarray(firsts).tolist()):
            first_of[int(token)] = (path, d)
    last: dict[str, int] = {}
    for batch in batches:
        for token in batch["input_ids"].flatten().tolist():
            if token in first_of:
                path, d = first_of[token]
                if d < last.get(path, -1):
                    return False
                last[path] = d
    return bool(last)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where to write the example corpus (default: a temp dir)")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="fmsdata-order-")
    info = write_corpus(root, {"web": 4, "code": 3}, docs_per_file=40, first_token=16)
    config = dict(
        data_path=info.root,
        datasets=["web", "code"],
        weights=[3, 1],
        seq_length=64,
        batch_size=4,
        logical_shards=4,
        bos_token=1,
        eos_token=2,
        num_workers=1,
    )
    steps, half = args.steps, args.steps // 2

    unshuffled = {**config, "shuffle_window": 0}
    order_ok = files_in_stored_order(
        take(build_dataloader(unshuffled, stages=file_shuffled), steps), info
    )
    print(f"each file's documents come in stored order: {order_ok}")

    reference = take(build_dataloader(config, stages=file_shuffled), steps)
    first = build_dataloader(config, stages=file_shuffled)
    take(first, half)
    state = first.state_dict()
    resumed = build_dataloader(config, stages=file_shuffled)
    resumed.load_state_dict(state)
    resume_ok = same(reference[half:], take(resumed, steps - half))
    print(f"resumed run continues exactly: {resume_ok}")

    # Two ranks of two rows each, saved half way, continued on one rank of four rows.
    ranks = [
        build_dataloader({**config, "batch_size": 2}, rank=r, world_size=2, stages=file_shuffled)
        for r in range(2)
    ]
    for loader in ranks:
        take(loader, half)
    states = [loader.state_dict() for loader in ranks]
    single = build_dataloader(config, rank=0, world_size=1, stages=file_shuffled)
    single.load_state_dict(states)
    rescale_ok = global_rows([take(single, steps - half)]) == global_rows([reference[half:]])
    print(f"two ranks rescaled to one continue exactly: {rescale_ok}")

    default = build_dataloader(config, stages=default_stages)
    take(default, 2)
    try:
        build_dataloader(config, stages=file_shuffled).load_state_dict(default.state_dict())
        refused = False
    except StateMismatchError as err:
        refused = "FileShuffle" in str(err)
    print(f"a state saved with the default order is refused: {refused}")
    return 0 if order_ok and resume_ok and rescale_ok and refused else 1


if __name__ == "__main__":
    raise SystemExit(main())
