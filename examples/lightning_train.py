"""Train a tiny LM on fmsdata batches with PyTorch Lightning; checkpoint, resume, rescale.

Launch with torchrun (CPU with gloo here; Lightning takes the processes torchrun started)::

    torchrun --nproc_per_node 2 examples/lightning_train.py --data DATA --ckpt-dir run \\
        --steps 4 --ckpt-every 4
    # resume from the newest run/step=N.ckpt on any number of processes dividing
    # --logical-shards:
    torchrun --nproc_per_node 1 examples/lightning_train.py --data DATA --ckpt-dir run --steps 8

The data is ``fmsdata.integrations.lightning.FmsDataModule``; Lightning's own
``ModelCheckpoint`` saves it (one ``.ckpt`` file, written by rank 0) and ``trainer.fit(...,
ckpt_path=...)`` loads it, unchanged. The global batch stays ``--global-batch-size``
whatever the number of processes; every global step's data hash (order-independent over the
step's sequences) is appended to ``--hash-log`` by rank 0.

BOS/EOS ids and the vocabulary size come from the data root's ``metadata.json`` (written by
``fmsdata tokenize`` and ``fmsdata demo``), so DATA can be their output as it is; ids given
with ``--bos-token``, ``--eos-token`` or ``--vocab-size`` that contradict it are refused. A
root without one (fms-fsdp / Bamba data) needs ``--eos-token`` and ``--vocab-size`` (and
``--bos-token`` where documents should start with one): those of the tokenizer that made it.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from pytorch_lightning.callbacks import ModelCheckpoint

from fmsdata.data.rootconfig import CLI_TOKEN_OPTIONS, root_token_ids
from fmsdata.errors import ConfigError
from fmsdata.integrations.lightning import FmsDataModule


class TinyLM(pl.LightningModule):
    def __init__(self, vocab: int, hash_log: str | None, dim: int = 16):
        super().__init__()
        torch.manual_seed(0)  # the same initial model on every rank and world size
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)
        self.hash_log = hash_log

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.log_step_hash(batch["input_ids"])
        logits = self.head(torch.tanh(self.embed(batch["input_ids"])))
        labels = batch["labels"]
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)

    def log_step_hash(self, input_ids: torch.Tensor) -> None:
        """Order-independent hash of the global step's sequences, gathered from every rank."""
        rows = [hashlib.blake2b(r.numpy().tobytes(), digest_size=8).hexdigest() for r in input_ids]
        world = dist.get_world_size() if dist.is_initialized() else 1
        gathered: list[Any] = [rows]
        if world > 1:
            gathered = [None] * world
            dist.all_gather_object(gathered, rows)
        everything = sorted(h for part in gathered for h in part)
        digest = hashlib.blake2b("".join(everything).encode(), digest_size=12).hexdigest()
        if self.global_rank == 0 and self.hash_log:
            with open(self.hash_log, "a") as log:
                row = {"step": self.global_step + 1, "hash": digest, "world_size": world}
                log.write(json.dumps(row) + "\n")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def newest_checkpoint(folder: str) -> str | None:
    """The ``step=N.ckpt`` file with the largest N in ``folder``, if any."""
    found = []
    for path in glob.glob(os.path.join(folder, "step=*.ckpt")):
        match = re.search(r"step=(\d+)\.ckpt$", path)
        if match:
            found.append((int(match.group(1)), path))
    return max(found)[1] if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="fmsdata data root")
    parser.add_argument("--ckpt-dir", required=True, help="Lightning checkpoint folder")
    parser.add_argument("--steps", type=int, default=8, help="train up to this global step")
    parser.add_argument("--ckpt-every", type=int, default=4)
    parser.add_argument("--global-batch-size", type=int, default=4, help="sequences per step")
    parser.add_argument("--seq-length", type=int, default=32)
    parser.add_argument("--logical-shards", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, help="default: the data's metadata.json")
    parser.add_argument("--bos-token", type=int, help="default: the data's metadata.json")
    parser.add_argument("--eos-token", type=int, help="default: the data's metadata.json")
    parser.add_argument("--hash-log", help="append {step, hash, world_size} lines here")
    args = parser.parse_args()
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

    datamodule = FmsDataModule(
        {
            "data_path": args.data,
            "seq_length": args.seq_length,
            "logical_shards": args.logical_shards,
            "shuffle_window": 4,
            "num_workers": 0,
            "bos_token": ids["bos_token"],
            "eos_token": ids["eos_token"],
            "vocab_size": ids["vocab_size"],  # a token id outside it: an error naming the file
        },
        global_batch_size=args.global_batch_size,
    )
    resume = newest_checkpoint(args.ckpt_dir)  # before this run writes any
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("WORLD_SIZE", 1)),
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ModelCheckpoint(
                dirpath=args.ckpt_dir,
                filename="{step}",
                every_n_train_steps=args.ckpt_every,
                save_top_k=-1,
            )
        ],
    )
    trainer.fit(TinyLM(ids["vocab_size"], args.hash_log), datamodule=datamodule, ckpt_path=resume)


if __name__ == "__main__":
    main()
