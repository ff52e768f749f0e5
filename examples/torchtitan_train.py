"""Train a tiny LM on fmsdata batches with torchtitan's checkpointing; resume and rescale.

Launch with torchrun (CPU with gloo here)::

    torchrun --nproc_per_node 2 examples/torchtitan_train.py --data DATA --dump run \\
        --steps 4 --ckpt-every 4
    # resume from run/checkpoint/step-4 on any number of processes dividing --logical-shards:
    torchrun --nproc_per_node 1 examples/torchtitan_train.py --data DATA --dump run --steps 8

The data loader is ``fmsdata.integrations.torchtitan.FmsDataTorchtitanLoader``, built from
its ``Config`` with the trainer's keyword arguments (data-parallel rank and size from
torchtitan's ``ParallelDims``, ``seq_len``, ``local_batch_size``), and saved and loaded by
torchtitan's own ``CheckpointManager`` (DCP), unchanged. torchtitan's ``Trainer`` needs a
GPU (it calls ``torch.cuda.set_device``), so this runs the trainer's pieces on CPU:
``CheckpointManager`` with a DDP model, ``OptimizersContainer``, ``LRSchedulersContainer``
and a ``train_state``, as ``Trainer`` wires them. The global batch stays
``--global-batch-size`` whatever the number of processes; every global step's data hash
(order-independent over the step's sequences) is appended to ``--hash-log`` by rank 0.

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
import torch.nn.functional as F
import torchtitan.distributed.parallel_dims
from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig
from torchtitan.distributed import ParallelDims

from fmsdata.data.rootconfig import CLI_TOKEN_OPTIONS, root_token_ids
from fmsdata.errors import ConfigError
from fmsdata.integrations.torchtitan import FmsDataTorchtitanLoader, dp_from_parallel_dims


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


class TrainState:
    """What torchtitan's ``Trainer`` checkpoints as ``train_state``: the step."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def global_step_hash(input_ids: torch.Tensor) -> str:
    """Order-independent hash of one global step's sequences, gathered from every rank."""
    rows = [hashlib.blake2b(row.numpy().tobytes(), digest_size=8).hexdigest() for row in input_ids]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    everything = sorted(h for part in gathered for h in part)
    return hashlib.blake2b("".join(everything).encode(), digest_size=12).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="fmsdata data root")
    parser.add_argument("--dump", required=True, help="torchtitan dump folder (checkpoints)")
    parser.add_argument("--steps", type=int, default=8, help="train up to this global step")
    parser.add_argument("--ckpt-every", type=int, default=4)
    parser.add_argument("--global-batch-size", type=int, default=4)
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
    world = dist.get_world_size()
    parallel_dims = ParallelDims(
        dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=1, world_size=world
    )
    # torchtitan picks "cuda" when no accelerator is found; its meshes live on CPU here.
    torchtitan.distributed.parallel_dims.device_type = "cpu"
    parallel_dims.build_mesh()
    dp_rank, dp_world_size = dp_from_parallel_dims(parallel_dims)

    # As torchtitan's Trainer builds it: config.dataloader.build(dp_world_size=..., ...).
    dataloader_config = FmsDataTorchtitanLoader.Config(
        dataset_path=args.data,
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
    )
    dataloader = dataloader_config.build(
        dp_world_size=dp_world_size,
        dp_rank=dp_rank,
        tokenizer=None,
        seq_len=args.seq_length,
        local_batch_size=args.global_batch_size // dp_world_size,
    )

    torch.manual_seed(0)  # the same initial model on every rank and world size
    model = nn.parallel.DistributedDataParallel(TinyLM(ids["vocab_size"]))
    optimizers = OptimizersContainer(
        OptimizersContainer.Config(
            param_groups=[
                ParamGroupConfig(
                    pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3}
                )
            ],
            implementation="for-loop",
        ),
        model_parts=[model],
    )
    lr_schedulers = LRSchedulersContainer(optimizers, lambda step: 1.0)
    train_state = TrainState()
    checkpointer = CheckpointManager(
        CheckpointManager.Config(
            enable=True, folder="checkpoint", interval=args.ckpt_every, keep_latest_k=0
        ),
        dataloader=dataloader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        states={"train_state": train_state},
        sd_adapter=None,
        base_folder=args.dump,
    )
    checkpointer.load()  # the newest step-N under --dump, if any; else a fresh start
    if dist.get_rank() == 0:
        print(f"starting after step {train_state.step} on {world} process(es)", flush=True)

    batches = iter(dataloader)
    while train_state.step < args.steps:
        inputs, labels = next(batches)
        logits = model(inputs["input"])
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        loss.backward()
        optimizers.step()
        lr_schedulers.step()
        optimizers.zero_grad()
        train_state.step += 1
        digest = global_step_hash(inputs["input"])
        if dist.get_rank() == 0 and args.hash_log:
            with open(args.hash_log, "a") as log:
                row = {"step": train_state.step, "hash": digest, "world_size": world}
                log.write(json.dumps(row) + "\n")
        checkpointer.save(train_state.step)  # saves when the step is a multiple of interval
    checkpointer.close()
    dataloader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
