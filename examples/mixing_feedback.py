"""Mixing that follows the model: online data mixing (ODM) on a tiny model, on CPU.

Two datasets of different difficulty: ``easy`` documents count upwards (each token is the
previous one plus one, which a bigram model learns in a few steps) and ``hard`` documents
are random tokens (nothing to learn: their loss stays near ln(vocab)). A bigram model
trains on the mix; after each step the loop reports the loss per token of the batch to
the loader (``record_loss``), and every ``mix_update_every`` steps ODM (Albalak et al.
2023, "Efficient Online Data Mixing For Language Model Pre-Training": EXP3 over the
datasets, rewarded by their training loss) moves the weights towards the dataset whose
loss is higher. Run it (a few seconds, no downloads; it writes a small corpus first):

    python examples/mixing_feedback.py

It prints the weights as applied (``mix_history``), each dataset's loss and share of the
tokens per stretch of the run, and checks that the hard dataset's weight rose, that the
tokens delivered follow the weights, and that a run resumed from a checkpoint taken
mid-run (loader state and model) continues with exactly the batches and weights of the
unbroken run. docs/guide/mixing-feedback.md explains what it does.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch

from fmsdata import build_dataloader
from fmsdata.handlers.arrow import write_arrow_docs

VOCAB = 512
FIRST = 8  # token ids below are left for delimiters
BOS, EOS = 1, 2


def write_root(root: str) -> None:
    """``easy``: documents counting up (mod the vocabulary); ``hard``: random tokens."""
    rng = np.random.default_rng(0)
    span = VOCAB - FIRST
    for name in ("easy", "hard"):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for f in range(2):
            docs = []
            # Enough hard documents that none comes twice: nothing of them can be learnt.
            for _ in range(200 if name == "easy" else 1200):
                n = int(rng.integers(20, 80))
                if name == "easy":
                    tokens = (int(rng.integers(span)) + np.arange(n)) % span + FIRST
                else:
                    tokens = rng.integers(FIRST, VOCAB, n)
                docs.append(tokens.astype(np.uint16))
            write_arrow_docs(os.path.join(root, name, f"part{f}.arrow"), docs, dtype=np.uint16)


class Bigram(torch.nn.Module):
    """Next-token logits from the current token alone."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(VOCAB, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


def train(loader, model, optimizer, steps: int, log: list) -> list[torch.Tensor]:
    """``steps`` steps from where ``loader`` is; each batch's loss per token reported to
    the loader. Appends (input ids, per-dataset token losses) to ``log``."""
    batches = []
    for batch in loader:
        logits = model(batch["input_ids"])
        loss = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), batch["labels"], ignore_index=-100, reduction="none"
        )  # [batch, seq]: 0 where the label is ignored
        counted = batch["labels"] != -100
        (loss.sum() / counted.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
        loader.record_loss(batch, loss.detach())
        batches.append(batch["input_ids"].clone())
        log.append((batch["input_ids"].clone(), loss.detach().clone()))
        if len(batches) == steps:
            break
    return batches


def dataset_of(ids: torch.Tensor) -> np.ndarray:
    """0 (easy) where a token continues a count (its predecessor plus one), 1 where it
    does not; -1 on delimiters and padding. Good enough to count shares by."""
    values = ids.numpy()
    out = np.full(values.shape, -1)
    body = values >= FIRST
    counting = np.zeros(values.shape, dtype=bool)
    counting[:, 1:] = (values[:, 1:] - values[:, :-1]) % (VOCAB - FIRST) == 1
    counting[:, :-1] |= (values[:, 1:] - values[:, :-1]) % (VOCAB - FIRST) == 1
    out[body] = np.where(counting[body], 0, 1)
    return out


def fresh(config: dict):
    torch.manual_seed(0)
    model = Bigram()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    return build_dataloader(config), model, optimizer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where to write the example corpus (default: a temp dir)")
    parser.add_argument("--steps", type=int, default=160)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the same float sums in every run: exact resume below
    root = args.dir or tempfile.mkdtemp(prefix="fmsdata-feedback-")
    write_root(root)
    config = dict(
        data_path=root,
        datasets=["easy", "hard"],
        weights=[1, 1],
        seq_length=64,
        batch_size=8,
        logical_shards=4,
        shuffle_window=2,
        bos_token=BOS,
        eos_token=EOS,
        vocab_size=VOCAB,
        num_workers=0,
        mix_policy="odm",
        mix_update_every=4,
        odm_smoothing=0.5,  # the paper's 0.9 suits thousands of updates; this run has 40
    )
    steps, half = args.steps, args.steps // 2

    loader, model, optimizer = fresh(config)
    log: list = []
    unbroken = train(loader, model, optimizer, steps, log)
    history = loader.mix_history
    print(f"weights as applied ({len(history) - 1} updates of ODM):")
    shown = history[:: max(1, len(history) // 8)]
    for step, weights in shown + ([history[-1]] if shown[-1] != history[-1] else []):
        print(f"  from step {step:>4}: easy {weights[0]:.3f}  hard {weights[1]:.3f}")
    quarter = steps // 4
    print("per quarter of the run: mean loss per token, share of tokens")
    shares = []
    for q in range(4):
        ids = torch.cat([i for i, _ in log[q * quarter : (q + 1) * quarter]])
        losses = torch.cat([v for _, v in log[q * quarter : (q + 1) * quarter]]).numpy()
        which = dataset_of(ids)
        mean = [losses[which == d].mean() for d in (0, 1)]
        share = (which == 1).sum() / (which >= 0).sum()
        shares.append(share)
        print(f"  steps {q * quarter:>4}-{(q + 1) * quarter - 1:<4} loss easy {mean[0]:.2f} "
              f"hard {mean[1]:.2f}   hard's share {share:.3f}")  # fmt: skip
    rose = history[-1][1][1] > history[0][1][1] + 0.1
    print(f"the hard dataset's weight rose: {rose}")
    late = [w[1] for at, w in history if at >= 3 * quarter]
    follows = abs(shares[-1] - float(np.mean(late))) < 0.05
    print(f"the tokens delivered follow the weights: {follows}")

    # Checkpoint mid-run (loader state and model), resume, report the same losses.
    loader, model, optimizer = fresh(config)
    train(loader, model, optimizer, half, [])
    saved = (loader.state_dict(), model.state_dict(), optimizer.state_dict())
    loader, model, optimizer = fresh(config)
    loader.load_state_dict(saved[0])
    model.load_state_dict(saved[1])
    optimizer.load_state_dict(saved[2])
    resumed = train(loader, model, optimizer, steps - half, [])
    exact = all(torch.equal(a, b) for a, b in zip(unbroken[half:], resumed))
    exact = exact and len(resumed) == steps - half and loader.mix_history == history
    print(f"resumed run continues exactly: {exact}")
    return 0 if rose and follows and exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
