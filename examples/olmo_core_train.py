"""Train a tiny LM on fmsdata batches with OLMo-core's Trainer; checkpoint, resume, rescale.

Launch with torchrun (CPU with gloo here)::

    torchrun --nproc_per_node 2 examples/olmo_core_train.py --data DATA --save run \\
        --steps 4 --ckpt-every 4
    # resume from run/step4 on any number of processes dividing --logical-shards:
    torchrun --nproc_per_node 1 examples/olmo_core_train.py --data DATA --save run --steps 8

The data loader is built by ``fmsdata.integrations.olmo_core.FmsDataLoaderConfig`` with the
train module's data-parallel process group; OLMo-core's own ``Trainer`` and its
``CheckpointerCallback`` save and load it (``step<N>/train/rank<r>.pt``), unchanged: a run
finding a checkpoint in ``--save`` resumes from it. The global batch stays
``--global-batch-size`` sequences whatever the number of processes; every global step's data
hash (order-independent over the step's sequences) is appended to ``--hash-log`` by rank 0.

BOS/EOS ids and the vocabulary size come from the data root's ``metadata.json`` (written by
``fmsdata tokenize`` and ``fmsdata demo``), so DATA can be their output as it is; ids given
with ``--bos-token``, ``--eos-token`` or ``--vocab-size`` that contradict it are refused. A
root without one (fms-fsdp / Bamba data) needs ``--eos-token`` and ``--vocab-size`` (and
``--bos-token`` where documents should start with one): those of the tokenizer that made it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from olmo_core.train import Duration, TrainerConfig
from olmo_core.train.callbacks import Callback, CheckpointerCallback
from olmo_core.train.train_module import BasicTrainModule

from fmsdata.data.rootconfig import CLI_TOKEN_OPTIONS, root_token_ids
from fmsdata.errors import ConfigError
from fmsdata.integrations.olmo_core import FmsDataLoaderConfig


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(input_ids)))


class CPUTrainModule(BasicTrainModule):
    """``BasicTrainModule`` without FLOP counts (it raises for them; the fit loop asks)."""

    def num_flops_per_token(self, seq_len: int) -> int | None:
        return None

    def global_num_flops_in_batch(self, batch: dict[str, Any]) -> int | None:
        return None


class StepHashes(Callback):
    """Appends each global step's data hash, gathered from every rank, to a file."""

    def __init__(self, path: str | None):
        self.path = path

    def pre_step(self, batch: dict[str, Any]) -> None:
        rows = [
            hashlib.blake2b(row.numpy().tobytes(), digest_size=8).hexdigest()
            for row in batch["input_ids"]
        ]
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, rows)
        everything = sorted(h for part in gathered for h in part)
        digest = hashlib.blake2b("".join(everything).encode(), digest_size=12).hexdigest()
        if dist.get_rank() == 0 and self.path:
            with open(self.path, "a") as log:
                row = {"step": self.step, "hash": digest, "world_size": dist.get_world_size()}
                log.write(json.dumps(row) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="fmsdata data root")
    parser.add_argument("--save", required=True, help="OLMo-core save folder (checkpoints)")
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

    dist.init_process_group("gloo")
    torch.manual_seed(0)  # the same initial model on every rank and world size
    model = nn.parallel.DistributedDataParallel(TinyLM(ids["vocab_size"]))
    tokens_per_step = args.global_batch_size * args.seq_length
    train_module = CPUTrainModule(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-3),
        rank_microbatch_size=tokens_per_step // dist.get_world_size(),
    )
    data_loader = FmsDataLoaderConfig(
        data_path=args.data,
        sequence_length=args.seq_length,
        global_batch_size=tokens_per_step,
        overrides=[
            f"logical_shards={args.logical_shards}",
            "shuffle_window=4",
            "num_workers=0",
            *(
                f"{name}={ids[name]}"
                for name in ("bos_token", "eos_token", "vocab_size")
                if ids[name] is not None
            ),
        ],
        work_dir=os.path.join(args.save, "work"),
    ).build(dp_process_group=train_module.dp_process_group)
    trainer = TrainerConfig(
        save_folder=args.save,
        work_dir=os.path.join(args.save, "work"),
        device="cpu",
        save_overwrite=True,
        max_duration=Duration.steps(args.steps),
        metrics_collect_interval=1,
        callbacks={
            "checkpointer": CheckpointerCallback(
                save_interval=args.ckpt_every, ephemeral_save_interval=None, save_async=False
            ),
            "hashes": StepHashes(args.hash_log),
        },
    ).build(train_module, data_loader)
    trainer.fit()  # loads the newest checkpoint in --save first, if any
    data_loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
