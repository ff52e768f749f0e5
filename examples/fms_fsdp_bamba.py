"""A Bamba-style training script on fmsdata: fms-fsdp's main_training_mamba.py, data part
and training loop, with one line changed.

In fms-fsdp the script imports its loader as

    from fms_fsdp.utils.dataloader_utils import get_data_loader, get_dummy_loader

Here that line reads

    from fmsdata.compat.fms_fsdp import get_data_loader, get_dummy_loader
from fmsdata.errors import ConfigError
from fmsdata.data.rootconfig import TOKEN_FIELDS, root_token_ids

and nothing else about the data changes: the same ``train_config`` fields, the same
``for batch_idx, (input, label) in enumerate(train_loader, start=start_step + 1)`` loop,
loader checkpoints every ``checkpoint_interval`` steps, a restarted job picking up where it
stopped, and ``--resuming_dataset True`` continuing another run's data (from
``ckpt_load_path``), on any number of ranks. What fms-fsdp provides and cannot be installed
here has small stand-ins below: ``train_config`` and ``update_config`` (same fields and
rules), a model ``Checkpointer`` with fms-fsdp's folder rules
(``ckpt_save_path/checkpoints/step_<N>_ckp``, newest by step number), and a tiny model in
place of ``MambaLMHeadModel`` (DDP over gloo so it runs on CPU; FSDP over NCCL on GPUs).

    torchrun --nproc_per_node 2 examples/fms_fsdp_bamba.py --data_path ROOT \\
        --datasets lang=en/dataset=commoncrawl,lang=de/dataset=wikipedia --weights 3,1 \\
        --seq_length 64 --logical_shards 8 --batch_size 4 --ckpt_save_path runs/a \\
        --num_steps 20 --checkpoint_interval 10
    # the next stage on one process, continuing run a's data (the same global batch, 8):
    torchrun --nproc_per_node 1 examples/fms_fsdp_bamba.py ... --batch_size 8 \\
        --ckpt_load_path runs/a --resuming_dataset True --ckpt_save_path runs/b

On a root written by ``fmsdata tokenize`` (``fmsdata demo`` writes one, dataset ``stdlib``),
``bos_token``, ``eos_token`` and ``vocab_size`` not given come from its ``metadata.json``
(given ones that contradict it are refused; without one, fms-fsdp's defaults apply):

    torchrun --nproc_per_node 2 examples/fms_fsdp_bamba.py --data_path ROOT --datasets DATASET \\
        --seq_length 64 --logical_shards 8 --batch_size 4 --ckpt_save_path runs/c \\
        --num_steps 20 --checkpoint_interval 10
    # a restarted job picks up where it stopped:
    torchrun --nproc_per_node 2 examples/fms_fsdp_bamba.py --data_path ROOT --datasets DATASET \\
        --seq_length 64 --logical_shards 8 --batch_size 4 --ckpt_save_path runs/c \\
        --num_steps 30 --checkpoint_interval 10

Those commands use fmsdata's order: exact on any number of ranks (stage b's steps are the
ones run a would have taken next). ``--order`` (not a train_config field: get_data_loader's
``order``) picks the other one:

- ``--order fms-fsdp``: the batches fms-fsdp's own loader (``mamba-new``; with
  ``--fim_training True``, ``mamba-fim``) yields for this config, rank, world size and
  ``num_workers``, bit for bit, so a Bamba run keeps its data sequence. It continues
  fms-fsdp's ``loader_state_*.pth`` and its own saves
  (``ckpt_save_path/fmsdata_fms_order/step_<N>_ckp``); on another world size it rescales
  as fms-fsdp does (buffers re-dealt), so the next stage's steps are fms-fsdp's, not run
  a's next ones:

      torchrun --nproc_per_node 2 examples/fms_fsdp_bamba.py --order fms-fsdp ... \
          --ckpt_save_path runs/a
      torchrun --nproc_per_node 1 examples/fms_fsdp_bamba.py --order fms-fsdp ... \
          --ckpt_load_path runs/a --resuming_dataset True --ckpt_save_path runs/b

- ``--order fmsdata``: fmsdata's order, as above;
- unset: fms-fsdp's order where there are checkpoints in that order to continue (a run
  moved from fms-fsdp), else fmsdata's.

``--batch_log FILE`` (not a train_config field either) appends each rank's rows per step
as hashes to ``FILE.rank<R>``, with ``digest``: SHA-256 (16 hex digits) of the step's input
then label as int32, as ``tests/compat`` records fms-fsdp's batches, so runs can be
compared with each other and with fms-fsdp's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from fmsdata.compat.fms_fsdp import get_data_loader, get_dummy_loader
from fmsdata.data.rootconfig import TOKEN_FIELDS, root_token_ids
from fmsdata.errors import ConfigError


@dataclasses.dataclass
class train_config:  # noqa: N801 -- stand-in for fms_fsdp.config.train_config
    # model
    model_variant: str = "tiny"
    ckpt_load_path: str = "/fsx/output/ckpt"
    ckpt_save_path: str = "/fsx/output/ckpt"
    # dataset and dataloader
    use_dummy_dataset: bool = False
    data_path: str = "/fsx/data"
    file_type: str = "arrow"
    col_name: str = "tokens"
    tokenizer_path: str = "/fsx/tokenizer"
    datasets: str = "lang=en/dataset=commoncrawl"
    weights: str = "1"
    seq_length: int = 4096
    vocab_size: int = 32000
    bos_token: Optional[int] = None  # noqa: UP045 -- as fms-fsdp writes it
    eos_token: int = 0
    bol_token: Optional[int] = None  # noqa: UP045
    eol_token: Optional[int] = None  # noqa: UP045
    strip_tokens: str = ""
    logical_shards: int = 1024
    num_workers: int = 1
    # fsdp policies
    sharding_strategy: str = "hsdp"
    fsdp_activation_checkpointing: bool = False
    selective_checkpointing: Union[float, str] = 1  # noqa: UP007
    mixed_precision: bool = True
    low_cpu_fsdp: bool = False
    # training spec
    batch_size: int = 2
    num_steps: int = 1000000
    training_stage: str = "initial"
    learning_rate: float = 3e-4
    grad_clip_thresh: float = 1.0
    seed: int = 2023
    # continued training spec
    resuming_dataset: bool = False
    # profiling
    use_profiler: bool = False
    profiler_rank0_only: bool = True
    # logging
    report_interval: int = 100
    checkpoint_interval: int = 10000
    tracker: Optional[str] = None  # noqa: UP045
    tracker_dir: str = "/fsx/aim_logs/llama"
    tracker_project_name: str = "llama"
    tracker_run_id: Optional[str] = None  # noqa: UP045
    # compile
    use_torch_compile: bool = True
    # speculator training
    tp_size: int = 8
    model_arch: str = "embedllama"
    model_path: str = "/path/to/model/"
    n_speculator_heads: int = 3
    speculator_width: int = 4096
    speculator_tie_weights: bool = True
    speculator_scale_input: bool = True
    stage2_start_step: int = 15000
    stage2_prompt_length: int = 64
    stage2_batch_size: int = 96
    stage2_seq_length: int = 256
    # FIM training
    fim_training: bool = False
    psm_rate: float = 0.0
    spm_rate: float = 0.0
    fim_pre: int = 1
    fim_mid: int = 2
    fim_suf: int = 3


def update_config(cfg: train_config, **kwargs: str) -> None:
    """Set fields from ``--name value`` pairs, typed like their defaults (fms-fsdp's rule:
    only existing fields)."""
    for name, raw in kwargs.items():
        if not hasattr(cfg, name):
            raise SystemExit(f"unknown config field {name!r}")
        default = getattr(cfg, name)
        if isinstance(default, bool):
            value: object = raw.lower() in ("1", "true", "yes")
        elif isinstance(default, (int, float)):
            value = type(default)(raw)
        elif default is None and raw.lstrip("-").isdigit():
            value = int(raw)
        else:
            value = raw
        setattr(cfg, name, value)


class Checkpointer:
    """fms-fsdp's model checkpoint folder rules: ``<dir>/checkpoints/step_<N>_ckp``, newest
    by the number after ``step_``; a job resumes from its own folder first."""

    def __init__(self, ckpdir: str, rank: int):
        self.ckp_path = os.path.join(ckpdir, "checkpoints")
        self.rank = rank
        os.makedirs(self.ckp_path, exist_ok=True)

    @staticmethod
    def latest(folder: str) -> str | None:
        if not os.path.isdir(folder) or not os.listdir(folder):
            return None
        name = max(os.listdir(folder), key=lambda entry: int(entry.split("_")[1]))
        path = os.path.join(folder, name)
        return path if os.path.isfile(os.path.join(path, "metadata.json")) else None

    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str):
        is_resuming = self.latest(self.ckp_path) is not None
        load_path = self.latest(self.ckp_path if is_resuming else path)
        if load_path is None:
            return model, optimizer, 0, 0, False
        state = torch.load(os.path.join(load_path, "model.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        with open(os.path.join(load_path, "metadata.json")) as handle:
            metadata = json.load(handle)
        return model, optimizer, metadata["step"], metadata["tokens_seen"], is_resuming

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **meta):
        folder = os.path.join(self.ckp_path, f"step_{step}_ckp")
        if self.rank == 0:
            os.makedirs(folder, exist_ok=True)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, os.path.join(folder, "model.pt"))
            with open(os.path.join(folder, "metadata.json"), "w") as handle:
                json.dump({"step": step, **meta}, handle)
        dist.barrier()


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, width: int = 16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def train(cfg, model, rank, train_loader, optimizer, checkpointer, start_step, tokens_seen, log):
    """fms-fsdp's train(): one optimizer step per batch, checkpoints every interval."""
    model.train()
    for batch_idx, (input, label) in enumerate(train_loader, start=start_step + 1):
        if batch_idx > cfg.num_steps:
            break
        output = model(input.long())
        loss = F.cross_entropy(output.view(-1, output.size(-1)), label.view(-1).long())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip_thresh)
        optimizer.step()
        optimizer.zero_grad()
        tokens_seen += input.numel() * dist.get_world_size()
        if log is not None:
            rows = [hashlib.sha1(bytes(str(row), "ascii")).hexdigest() for row in input.tolist()]
            digest = hashlib.sha256()
            for part in (input, label):
                digest.update(part.to(torch.int32).contiguous().numpy().tobytes())
            row = {"step": batch_idx, "rows": rows, "digest": digest.hexdigest()[:16]}
            log.write(json.dumps(row) + "\n")
        if rank == 0 and batch_idx % cfg.report_interval == 0:
            print(f"step {batch_idx}: loss {loss.item():.3f}, tokens {tokens_seen}", flush=True)
        if batch_idx % cfg.checkpoint_interval == 0:
            checkpointer.save(batch_idx, model, optimizer, tokens_seen=tokens_seen)


def take_token_ids(cfg: train_config, given: dict[str, str]) -> None:
    """``bos_token``, ``eos_token`` and ``vocab_size`` not given on the command line: from
    the data root's ``metadata.json`` where it has one (``fmsdata tokenize`` output), else
    fms-fsdp's defaults; given ones that contradict it are refused."""
    try:
        ids = root_token_ids(
            cfg.data_path,
            *(int(given[name]) if name in given else None for name in TOKEN_FIELDS),
            required=(),
            option_names={name: f"--{name}" for name in TOKEN_FIELDS},
        )
    except ConfigError as err:
        raise SystemExit(str(err)) from None
    for name in TOKEN_FIELDS:
        if name not in given and ids[name] is not None:
            setattr(cfg, name, ids[name])


def main(**kwargs: str) -> None:
    batch_log = kwargs.pop("batch_log", None)
    # --order fms-fsdp: fms-fsdp's own batches, bit for bit, continuing its loader_state_*.pth;
    # --order fmsdata: exact rescale; unset: fms-fsdp order only where its checkpoints exist.
    order = kwargs.pop("order", None)
    cfg = train_config()
    update_config(cfg, **kwargs)
    if not cfg.use_dummy_dataset:
        take_token_ids(cfg, given=kwargs)
    torch.manual_seed(cfg.seed)  # the model's initialization, as in fms-fsdp

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")

    model = TinyLM(cfg.vocab_size)
    if rank == 0:
        print("Constructing datasets...", flush=True)
    if not cfg.use_dummy_dataset:
        train_loader = get_data_loader(cfg, rank, world_size, order=order)
    else:
        train_loader = get_dummy_loader(cfg, rank, world_size)
    if rank == 0:
        print("Datasets constructed!", flush=True)

    model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
    checkpointer = Checkpointer(cfg.ckpt_save_path, rank)
    model, optimizer, start_step, tokens_seen, is_resuming = checkpointer.load(
        model, optimizer, path=os.path.join(cfg.ckpt_load_path, "checkpoints")
    )
    if not is_resuming:
        start_step = 0
    if rank == 0:
        print(f"Training for {cfg.num_steps} steps from step {start_step}", flush=True)

    log = open(f"{batch_log}.rank{rank}", "a") if batch_log else None
    try:
        train(cfg, model, rank, train_loader, optimizer, checkpointer, start_step, tokens_seen, log)
    finally:
        if log is not None:
            log.close()
    dist.barrier()
    dist.destroy_process_group()


def parse_flags(argv: list[str]) -> dict[str, str]:
    """``--name value`` pairs (the fire-style command line of fms-fsdp's scripts)."""
    if len(argv) % 2 or not all(arg.startswith("--") for arg in argv[::2]):
        raise SystemExit("usage: fms_fsdp_bamba.py --field value [--field value ...]")
    return {name[2:]: value for name, value in zip(argv[::2], argv[1::2])}


if __name__ == "__main__":
    main(**parse_flags(sys.argv[1:]))
