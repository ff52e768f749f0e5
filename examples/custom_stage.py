"""Add your own stage to the default chain, train on it, save, resume and rescale exactly.

``Thin`` is a span-level stage (it works on lines of spans, before any token is read): it
keeps one line in ``keep_one_in`` — say, for a quick ablation on a fraction of the data.
It goes between the packer and the shuffle buffer of every logical shard:

    documents -> mix -> pack -> Thin -> shuffle

Its state is one integer (lines read); the loader saves it with the rest, resumes it, and
moves it with its logical shard when the number of ranks changes. Run it (no downloads;
it writes a small corpus first):

    python examples/custom_stage.py
    # or on your own data root, e.g. the output of fmsdata demo or fmsdata tokenize (its
    # BOS/EOS ids and vocabulary from its metadata.json):
    python examples/custom_stage.py --data ROOT

It trains a tiny model for a few steps on the thinned stream, saves the loader state,
checks that a fresh loader resumes with exactly the batches that followed, and that the
state saved by two ranks continues on one rank with exactly the same global steps.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from fmsdata import build_dataloader
from fmsdata.data.rootconfig import CLI_TOKEN_OPTIONS, root_token_ids
from fmsdata.data.synthetic import write_corpus
from fmsdata.errors import ConfigError
from fmsdata.stages import SpanStage, Stage
from fmsdata.stages.shard import Shard


class Thin(SpanStage):
    """Passes one line in ``keep_one_in`` of its source on; drops the others."""

    def __init__(self, source: Stage, keep_one_in: int):
        super().__init__(source)
        self.keep_one_in = keep_one_in
        self.seen = 0  # lines read from the source

    def __next__(self):
        while True:
            line = next(self.source)
            self.seen += 1
            if self.seen % self.keep_one_in == 0:
                return line

    # Its own fields; the source's state is nested under "source" by the base class.
    def own_state(self) -> dict:
        return {"seen": self.seen}

    def load_own_state(self, state: dict) -> None:
        self.seen = int(state["seen"])

    # What its output depends on: a state saved with another value is refused.
    def settings(self) -> dict:
        return {"keep_one_in": self.keep_one_in}


def thinned(shard: Shard) -> Stage:
    """The default chain with ``Thin`` between packer and shuffle buffer (a module-level
    function: DataLoader workers receive it pickled)."""
    return shard.shuffle(Thin(shard.pack(shard.documents()), keep_one_in=3))


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


def train(loader, steps: int, vocab: int) -> float:
    """A few optimizer steps of a tiny next-token model on the loader's batches."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.tensor(0.0)
    for batch in take(loader, steps):
        logits = model(batch["input_ids"] % vocab)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, vocab), (batch["labels"] % vocab).reshape(-1), ignore_index=-100
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where to write the example corpus (default: a temp dir)")
    parser.add_argument("--data", help="train on this data root instead of a generated corpus")
    parser.add_argument("--bos-token", type=int, help="default: the data's metadata.json")
    parser.add_argument("--eos-token", type=int, help="default: the data's metadata.json")
    parser.add_argument("--vocab-size", type=int, help="default: the data's metadata.json")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    common = dict(seq_length=64, batch_size=4, logical_shards=4, num_workers=1)
    if args.data:
        try:  # ids left unset come from the data's metadata.json; given ones are checked
            ids = root_token_ids(
                args.data,
                args.bos_token,
                args.eos_token,
                args.vocab_size,
                option_names=CLI_TOKEN_OPTIONS,
            )
        except ConfigError as err:
            raise SystemExit(str(err)) from None
        config = dict(data_path=args.data, **ids, **common)
        vocab = ids["vocab_size"]
    else:
        root = args.dir or tempfile.mkdtemp(prefix="fmsdata-stage-")
        info = write_corpus(root, {"web": 4, "code": 3}, docs_per_file=40, first_token=16)
        config = dict(
            data_path=info.root,
            datasets=["web", "code"],
            weights=[3, 1],
            bos_token=1,
            eos_token=2,
            **common,
        )
        vocab = 512  # the tiny model folds the corpus's token values (which say where
        # each token came from) into a small vocabulary
    steps, half = args.steps, args.steps // 2

    loss = train(build_dataloader(config, stages=thinned), steps, vocab=vocab)
    print(f"trained {steps} steps on the thinned stream, last loss {loss:.3f}")

    reference = take(build_dataloader(config, stages=thinned), steps)
    first = build_dataloader(config, stages=thinned)
    take(first, half)
    state = first.state_dict()
    resumed = build_dataloader(config, stages=thinned)
    resumed.load_state_dict(state)
    resume_ok = same(reference[half:], take(resumed, steps - half))
    print(f"resumed run continues exactly: {resume_ok}")

    # Two ranks of two rows each, saved at half way, continued on one rank of four rows.
    ranks = [
        build_dataloader({**config, "batch_size": 2}, rank=r, world_size=2, stages=thinned)
        for r in range(2)
    ]
    for loader in ranks:
        take(loader, half)
    states = [loader.state_dict() for loader in ranks]
    single = build_dataloader(config, rank=0, world_size=1, stages=thinned)
    single.load_state_dict(states)
    rescale_ok = global_rows([take(single, steps - half)]) == global_rows([reference[half:]])
    print(f"two ranks rescaled to one continue exactly: {rescale_ok}")
    return 0 if resume_ok and rescale_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
