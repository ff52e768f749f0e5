"""Train a small decoder-only LM with FSDP2 on fmsdata batches; checkpoint, resume, rescale.

Launch with torchrun (CPU with gloo here, GPUs with nccl unchanged)::

    torchrun --nproc_per_node 2 examples/train_fsdp.py --data DATA_ROOT --steps 100 \\
        --ckpt-dir ckpt --ckpt-every 50
    # later, on any number of processes that divides --logical-shards:
    torchrun --nproc_per_node 4 examples/train_fsdp.py --data DATA_ROOT --steps 200 \\
        --ckpt-dir ckpt --resume

Model, optimizer and loader are saved together with ``torch.distributed.checkpoint``. The
global batch stays ``--global-batch-size`` whatever the world size, so a resumed run sees
exactly the global steps the first run would have seen; every global step's data hash
(order-independent over the step's sequences) and loss (the mean over every rank's
tokens, so the same figure on any world size) is appended to ``--hash-log`` to show it.

BOS/EOS ids and the vocabulary size come from the data root's ``metadata.json`` (written
by ``fmsdata tokenize`` and the demo); ids given on the command line that contradict it
are refused. A root without one (fms-fsdp / Bamba data) needs ``--bos-token``,
``--eos-token`` and ``--vocab-size``: the ids of the tokenizer that made the data.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from fmsdata import build_dataloader
from fmsdata.checkpoint import LoadPlanner, SafeFileSystemReader
from fmsdata.data.rootconfig import CLI_TOKEN_OPTIONS, root_token_ids
from fmsdata.errors import ConfigError

logger = logging.getLogger("train_fsdp")


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, max_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def shard_model(model: nn.Module) -> nn.Module:
    """FSDP2 where it runs (GPUs, or CPU with gloo on recent torch); DDP otherwise."""
    try:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    except (ImportError, RuntimeError, NotImplementedError) as err:  # pragma: no cover
        if dist.get_rank() == 0:
            print(f"FSDP2 unavailable here ({err}); using DDP")
        return nn.parallel.DistributedDataParallel(model)


def step_hash(input_ids: torch.Tensor) -> str:
    """Order-independent hash of one global step's sequences, gathered on every rank."""
    rows = [hashlib.blake2b(row.numpy().tobytes(), digest_size=8).hexdigest() for row in input_ids]
    gathered: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, rows)
    everything = sorted(h for part in gathered for h in part)
    return hashlib.blake2b("".join(everything).encode(), digest_size=12).hexdigest()


def global_mean_loss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Cross-entropy over every rank's tokens of the step: comparable across world sizes
    (each rank's own mean is over its share of the batch only)."""
    with torch.no_grad():
        total = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum"
        )
        figures = torch.stack([total, (labels != -100).sum().to(total.dtype)])
        dist.all_reduce(figures)  # SUM: gloo has no AVG
    return (figures[0] / figures[1].clamp(min=1)).item()


def latest_step(ckpt_dir: str) -> int | None:
    path = os.path.join(ckpt_dir, "latest")
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return int(handle.read())


def resume_step(ckpt_dir: str, say: bool = True) -> int:
    """The step ``--resume`` continues from, 0 when ``ckpt_dir`` holds no checkpoint.

    Starting afresh although asked to resume is said at WARNING (a wrong ``--ckpt-dir``
    would otherwise retrain from step 0 without a word); what it resumes from, at INFO.
    ``say``: whether this process logs (rank 0).
    """
    step = latest_step(ckpt_dir)
    if step is None:
        if say:
            logger.warning(
                "--resume: %s holds no checkpoint (no 'latest' file); starting from step 0",
                os.path.abspath(ckpt_dir),
            )
        return 0
    if say:
        folder = os.path.abspath(os.path.join(ckpt_dir, f"step_{step:06d}"))
        logger.info("--resume: resuming from %s (step %d)", folder, step)
    return step


def save(
    ckpt_dir: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, loader
) -> None:
    model_state, optim_state = get_state_dict(model, optimizer)
    folder = os.path.join(ckpt_dir, f"step_{step:06d}")
    dcp.save(
        {"model": model_state, "optim": optim_state, "dataloader": loader}, checkpoint_id=folder
    )
    dist.barrier()
    if dist.get_rank() == 0:  # the pointer moves only once every rank has written
        partial = os.path.join(ckpt_dir, "latest.tmp")
        with open(partial, "w") as handle:
            handle.write(str(step))
        os.replace(partial, os.path.join(ckpt_dir, "latest"))
    dist.barrier()


def load(
    ckpt_dir: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, loader
) -> None:
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "dataloader": loader}
    folder = os.path.join(ckpt_dir, f"step_{step:06d}")
    # SafeFileSystemReader: the checkpoint's pickles (.metadata, non-tensor entries) are
    # read through allow-lists, so loading a checkpoint from elsewhere runs nothing.
    dcp.load(
        state,
        checkpoint_id=folder,
        storage_reader=SafeFileSystemReader(folder),
        planner=LoadPlanner(),
    )
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="fmsdata data root")
    parser.add_argument("--steps", type=int, default=100, help="train until this global step")
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--logical-shards", type=int, default=8)
    parser.add_argument(
        "--vocab-size", type=int, help="model vocabulary (default: from the data's metadata.json)"
    )
    parser.add_argument(
        "--bos-token", type=int, help="BOS id (default: from the data's metadata.json)"
    )
    parser.add_argument(
        "--eos-token", type=int, help="EOS id (default: from the data's metadata.json)"
    )
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    parser.add_argument("--ckpt-dir", default="ckpt")
    parser.add_argument("--ckpt-every", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument(
        "--hash-log", default=None, help="append JSON lines of step, data hash, loss"
    )
    args = parser.parse_args()
    try:  # ids left unset come from the data's metadata.json; given ones are checked
        tokens = root_token_ids(
            args.data,
            args.bos_token,
            args.eos_token,
            args.vocab_size,
            option_names=CLI_TOKEN_OPTIONS,
        )
    except ConfigError as err:
        raise SystemExit(str(err)) from None

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if backend == "nccl"
        else torch.device("cpu")
    )
    if args.global_batch_size % world:
        raise SystemExit(
            f"--global-batch-size {args.global_batch_size} is not divisible by {world} ranks"
        )

    torch.manual_seed(0)  # the same initial weights on every rank and every world size
    model = shard_model(
        TinyLM(tokens["vocab_size"], dim=64, layers=2, heads=4, max_len=args.seq_length).to(device)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = build_dataloader(
        {
            "data_path": args.data,
            "seq_length": args.seq_length,
            "batch_size": args.global_batch_size // world,
            "logical_shards": args.logical_shards,
            "shuffle_window": 4,
            "bos_token": tokens["bos_token"],
            "eos_token": tokens["eos_token"],
            "num_workers": args.workers,
            "vocab_size": tokens["vocab_size"],  # a token id outside it: an error naming the file
        }
    )

    step = first_step = 0
    if args.resume:
        step = resume_step(args.ckpt_dir, say=rank == 0)
        if step:
            load(args.ckpt_dir, step, model, optimizer, loader)
            first_step = step
            if rank == 0:
                print(f"resumed at step {step} on {world} rank(s)")
    if rank == 0:
        print(
            f"bos_token {tokens['bos_token']}, eos_token {tokens['eos_token']}, vocab_size "
            f"{tokens['vocab_size']}"
        )

    log = None
    if args.hash_log and rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.hash_log)), exist_ok=True)
        log = open(args.hash_log, "a")
    started = time.perf_counter()
    mean_loss = float("nan")
    for batch in loader:
        if step >= args.steps:
            break
        step += 1
        inputs, labels = batch["input_ids"].to(device), batch["labels"].to(device)
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean_loss = global_mean_loss(logits, labels)
        digest = step_hash(batch["input_ids"])
        if log is not None:
            log.write(
                json.dumps(
                    {"step": step, "world_size": world, "data_hash": digest, "loss": mean_loss}
                )
                + "\n"
            )
            log.flush()
        if args.ckpt_every and step % args.ckpt_every == 0:
            save(args.ckpt_dir, step, model, optimizer, loader)
    if rank == 0:
        tokens = (step - first_step) * args.global_batch_size * args.seq_length
        rate = tokens / (time.perf_counter() - started)
        print(f"done at step {step}: loss {mean_loss:.3f} (all ranks), {rate:,.0f} tokens/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
