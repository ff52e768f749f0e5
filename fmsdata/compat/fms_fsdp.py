"""fms-fsdp's loader entry points over fmsdata: a Bamba training script changes one import.

    from fmsdata.compat.fms_fsdp import get_data_loader, get_dummy_loader

``get_data_loader(cfg, rank, world_size, postprocess=[causal_lm])`` takes fms-fsdp's
``train_config`` instance as it is and gives each loader field fms-fsdp's meaning
(``fms_fsdp/utils/dataloader_utils.py``):

- documents lose one of ``strip_tokens`` + bos/eos/bol/eol ids at each edge, then get
  ``bos_token`` / ``eos_token``; a document shorter than 3 tokens counting those is dropped;
- ``col_name`` is a comma list of candidate columns, resolved per file; ``file_type`` is
  ``arrow``, ``hf_parquet`` (a text column tokenized with ``tokenizer_path``) or ``auto``
  (or any fmsdata format name);
- ``vocab_size`` is a model field, not a check of the data;
- batches are ``postprocess`` applied in order to each int32 line, collated: with the
  default ``[causal_lm]``, ``(input, label)`` of ``[batch_size, seq_length]`` (written by
  the workers as the loader's own int32 outputs, not run per line); lines are
  ``seq_length + 1`` tokens when ``causal_lm`` is among the steps, else ``seq_length``;
- the loader saves its state every ``checkpoint_interval`` steps under
  ``ckpt_save_path/fmsdata_loader/step_NNNNNNNNN/``, beside (never inside) the
  ``checkpoints/`` folder that fms-fsdp's model ``Checkpointer`` scans; it resumes from the
  newest complete one there (a restarted job), else, with ``resuming_dataset``, from the
  newest under ``ckpt_load_path/fmsdata_loader/`` with its step count restarted at 0.
  ``ckpt_save_path`` and ``ckpt_load_path`` may be URLs (``s3://bucket/run``: credentials
  and endpoint from the AWS environment), and ``data_path`` too; with
  ``order="fms-fsdp"`` all three are local folders, as fms-fsdp's own code reads them.

Model and training fields are ignored by name (``FOREIGN_FIELDS``); any other field is an
error, so a misspelt loader field never goes unnoticed.
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from fmsdata.checkpoint import latest_checkpoint, load_loader_state
from fmsdata.compat.fms_order import FmsOrderDataset, fms_resume_source
from fmsdata.config import LoaderConfig
from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.loader import FmsDataLoader, build_dataloader
from fmsdata.remote.folder import Folder
from fmsdata.util.textcorpus import TOKENIZER_HINT
from fmsdata.util.urls import is_url, local_path, location

__all__ = [
    "FMS_DEFAULTS",
    "FOREIGN_FIELDS",
    "LOADER_CHECKPOINTS",
    "causal_lm",
    "get_data_loader",
    "get_dummy_loader",
    "loader_config",
]

logger = logging.getLogger(__name__)

# Loader fields of fms-fsdp's train_config (mamba-new and FIM branches) and their defaults,
# used for fields an older config lacks (datasets and weights: every folder, equally).
FMS_DEFAULTS: dict[str, Any] = {
    "ckpt_load_path": "/fsx/output/ckpt",
    "ckpt_save_path": "/fsx/output/ckpt",
    "data_path": "/fsx/data",
    "file_type": "arrow",
    "col_name": "tokens",
    "tokenizer_path": "/fsx/tokenizer",
    "datasets": None,
    "weights": None,
    "seq_length": 4096,
    "vocab_size": 32000,
    "bos_token": None,
    "eos_token": 0,
    "bol_token": None,
    "eol_token": None,
    "strip_tokens": "",
    "logical_shards": 1024,
    "num_workers": 1,
    "batch_size": 2,
    "seed": 2023,
    "resuming_dataset": False,
    "checkpoint_interval": 10000,
    "fim_training": False,
    "psm_rate": 0.0,
    "spm_rate": 0.0,
    "fim_pre": 1,
    "fim_mid": 2,
    "fim_suf": 3,
}

# Fields of train_config that drive the model, FSDP, optimizer, logging or the script
# itself (use_dummy_dataset picks get_dummy_loader): accepted and ignored.
FOREIGN_FIELDS = frozenset(
    """
    model_variant use_dummy_dataset sharding_strategy fsdp_activation_checkpointing
    selective_checkpointing mixed_precision low_cpu_fsdp num_steps training_stage
    learning_rate grad_clip_thresh use_profiler profiler_rank0_only report_interval
    tracker tracker_dir tracker_project_name tracker_run_id use_torch_compile tp_size
    model_arch model_path n_speculator_heads speculator_width speculator_tie_weights
    speculator_scale_input stage2_start_step stage2_prompt_length stage2_batch_size
    stage2_seq_length
    """.split()
)

# Folder of loader checkpoints under ckpt_save_path / ckpt_load_path.
LOADER_CHECKPOINTS = "fmsdata_loader"

# fms-fsdp drops documents shorter than this, counting the BOS/EOS it adds.
_MIN_DOCUMENT = 3
_FMS_FILE_TYPES = {"arrow": "arrow", "hf_parquet": "parquet", "auto": "auto"}


def causal_lm(data_seq: torch.Tensor, prompt_len: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """fms-fsdp's causal-LM step: ``(line[:-1], line[1:])`` as int32, with the first
    ``prompt_len`` label positions set to -100 (ignored by the loss)."""
    line = torch.as_tensor(data_seq).to(torch.int32)
    label = line[1:].clone()
    label[:prompt_len] = -100
    return line[:-1], label


def train_config_values(cfg: Any) -> dict[str, Any]:
    """The loader fields of a ``train_config`` (instance, object or mapping), with
    fms-fsdp's defaults for those it lacks.

    Raises:
        ConfigError: A field that is neither a loader field nor a known foreign one.
    """
    if isinstance(cfg, Mapping):
        values = dict(cfg)
    elif dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        values.update(vars(cfg))
    elif hasattr(cfg, "__dict__") and not isinstance(cfg, type):
        values = dict(vars(cfg))
    else:
        raise ConfigError(f"expected fms-fsdp's train_config, got {type(cfg).__name__}")
    unknown = sorted(set(values) - set(FMS_DEFAULTS) - FOREIGN_FIELDS)
    if unknown:
        hints = [
            f"{name!r} (did you mean {close[0]!r}?)"
            for name in unknown
            for close in [difflib.get_close_matches(name, list(FMS_DEFAULTS), n=1)]
            if close
        ]
        raise ConfigError(
            f"train_config field(s) {unknown} are neither fms-fsdp loader fields nor known "
            "model/training fields" + (f"; {', '.join(hints)}" if hints else "")
        )
    return {name: values.get(name, default) for name, default in FMS_DEFAULTS.items()}


def loader_config(
    cfg: Any, postprocess: Sequence[Callable[..., Any]] = (causal_lm,)
) -> LoaderConfig:
    """The fmsdata config that gives ``cfg``'s loader fields fms-fsdp's meaning."""
    return _config(train_config_values(cfg), tuple(postprocess))


def _config(values: dict[str, Any], postprocess: tuple[Callable[..., Any], ...]) -> LoaderConfig:
    file_type = _FMS_FILE_TYPES.get(values["file_type"], values["file_type"])
    specials = [values[name] for name in ("bos_token", "eos_token", "bol_token", "eol_token")]
    strip = _int_list("strip_tokens", values["strip_tokens"])
    added = (values["bos_token"] is not None) + (values["eos_token"] is not None)
    # fms-fsdp packs seq_length + 1 tokens only when causal_lm will shift them.
    seq_length = _int("seq_length", values["seq_length"]) - (causal_lm not in postprocess)
    return LoaderConfig(
        data_path=values["data_path"],
        datasets=values["datasets"],
        weights=values["weights"],
        allow_mix_change=True,  # fms-fsdp resumes with new weights; fmsdata does so exactly
        file_type=file_type,
        col_name=values["col_name"],
        tokenizer=_tokenizer(values["tokenizer_path"], required=file_type == "parquet"),
        seq_length=seq_length,
        batch_size=values["batch_size"],
        bos_token=values["bos_token"],
        eos_token=values["eos_token"],
        bol_token=values["bol_token"],
        eol_token=values["eol_token"],
        strip_tokens=tuple(sorted({*strip, *(t for t in specials if t is not None)})),
        min_length=max(1, _MIN_DOCUMENT - added),
        logical_shards=values["logical_shards"],
        seed=values["seed"],
        num_workers=values["num_workers"],
        vocab_size=None,  # a model field in fms-fsdp, never a check of the data
        batch_format="tuple",
        checkpoint_dir=_loader_checkpoints("ckpt_save_path", values["ckpt_save_path"], True),
        checkpoint_every=max(0, _int("checkpoint_interval", values["checkpoint_interval"])),
        checkpoint_keep=0,  # fms-fsdp keeps every loader checkpoint
        # Fill-in-the-middle as the mamba-fim branch does it, keyed by (seed, shard, line).
        fim_training=values["fim_training"],
        psm_rate=values["psm_rate"],
        spm_rate=values["spm_rate"],
        fim_pre=values["fim_pre"],
        fim_mid=values["fim_mid"],
        fim_suf=values["fim_suf"],
        # The default postprocess, written by the workers as they write every batch.
        output_dtype="int32" if postprocess == (causal_lm,) else "int64",
        ignore_first_labels=1 if postprocess == (causal_lm,) else 0,
    )


def get_data_loader(
    cfg: Any,
    rank: int,
    world_size: int,
    postprocess: Sequence[Callable[..., Any]] = (causal_lm,),
    order: str | None = None,
) -> FmsDataLoader | DataLoader:
    """fms-fsdp's ``get_data_loader``: this rank's stateful loader over ``cfg``'s data.

    Args:
        cfg: fms-fsdp's ``train_config`` (or any object or mapping with its fields).
        rank: This process's rank.
        world_size: The number of ranks in the job.
        postprocess: Callables applied in order to each line (an int32 tensor); their
            result (a tensor or a tuple of tensors) is batched like PyTorch's collate.

        order: ``"fmsdata"`` (exact rescale, see the docs' fms-fsdp page) or ``"fms-fsdp"``: the
            batches fms-fsdp ``mamba-new`` yields for this config, rank, world size and
            workers, bit for bit (with ``fim_training``: ``mamba-fim``'s, FIM included),
            resuming from its ``loader_state_*.pth`` checkpoints
            (``fmsdata.compat.fms_order``). None: ``"fms-fsdp"`` when there are
            checkpoints in that order to resume from (fms-fsdp's own or fmsdata's in its
            order) and no fmsdata-order ones, else ``"fmsdata"``.

    Returns:
        With ``order="fmsdata"``, an ``FmsDataLoader`` (``state_dict`` /
        ``load_state_dict`` as everywhere in fmsdata) that also saves itself every
        ``checkpoint_interval`` steps; with ``"fms-fsdp"``, a ``DataLoader`` whose
        producers save every ``checkpoint_interval`` of their batches, as fms-fsdp's do.

    Raises:
        ConfigError: An unknown field or an invalid value.
        StateMismatchError: ``resuming_dataset`` with no loader checkpoint to resume, or
            one saved with a config that changes the data stream.
    """
    steps = tuple(postprocess)
    values = train_config_values(cfg)
    # Every path is checked before anything is read or written.
    if order == "fms-fsdp":
        _fms_order_paths(values)
    own = _loader_checkpoints("ckpt_save_path", values["ckpt_save_path"], write=True)
    load_from = (
        _loader_checkpoints("ckpt_load_path", values["ckpt_load_path"])
        if values["resuming_dataset"]
        else None
    )
    restart = latest_checkpoint(own) is not None  # a restarted job: build_dataloader resumes
    if order is None:
        order = "fmsdata"
        # fms-fsdp-order checkpoints are looked for only where both checkpoint paths are
        # local (a URL is never looked up as a local folder named ``s3:``)
        local = not any(is_url(values[f]) for f in ("ckpt_save_path", "ckpt_load_path"))
        if not restart and local and fms_resume_source(values) is not None:
            order = "fms-fsdp"
            logger.info("fms-fsdp-order loader checkpoints found: continuing in fms-fsdp order")
    if order == "fms-fsdp":
        _fms_order_paths(values)  # again: order=None may have chosen it
        return _fms_order_loader(values, rank, world_size, steps)
    if order != "fmsdata":
        raise ConfigError(f"order must be 'fmsdata' or 'fms-fsdp', got {order!r}")
    config = _config(values, steps)
    # ``[causal_lm]`` is the loader's own outputs (int32, the first label ignored), written
    # by the workers into the shared batch ring; any other chain runs on each line.
    preprocess = None if steps == (causal_lm,) else _Postprocess(steps)
    loader = build_dataloader(config, rank, world_size, preprocess=preprocess)
    if not restart and load_from is not None:
        latest = latest_checkpoint(load_from)
        if latest is None:
            raise StateMismatchError(_nothing_to_resume(values["ckpt_load_path"], load_from))
        load_loader_state(loader, latest)
        loader.restart_step_count()
    return loader


def _fms_order_loader(
    values: dict[str, Any], rank: int, world_size: int, steps: tuple[Callable[..., Any], ...]
) -> DataLoader:
    if values["file_type"] not in ("auto", "arrow"):
        raise ConfigError(
            f"file_type={values['file_type']!r}: order='fms-fsdp' reads Arrow shards "
            "(file_type 'auto' or 'arrow'); hf_parquet is not reproduced yet"
        )
    if values["file_type"] == "arrow":
        logger.warning(
            "file_type='arrow' raises a KeyError in fms-fsdp mamba-new (its users run "
            "'auto'); read here as 'auto' on Arrow shards"
        )
    for field in ("batch_size", "seq_length", "logical_shards", "seed", "checkpoint_interval"):
        _int(field, values[field])
    length = values["seq_length"] + (causal_lm in steps)
    dataset = FmsOrderDataset(values, rank, world_size, steps, length)
    return DataLoader(
        dataset,
        num_workers=_int("num_workers", values["num_workers"]),
        batch_size=values["batch_size"],
    )


def get_dummy_loader(cfg: Any, rank: int, world_size: int) -> DataLoader:
    """fms-fsdp's ``get_dummy_loader``: batches of ``(ids, ids)`` where ``ids`` counts up
    through ``seq_length`` int32 values at a time, modulo ``vocab_size``, forever."""
    values = train_config_values(cfg)
    counter = _Counter(
        _int("seq_length", values["seq_length"]), _int("vocab_size", values["vocab_size"])
    )
    return DataLoader(counter, batch_size=_int("batch_size", values["batch_size"]))


class _Counter(IterableDataset):
    def __init__(self, length: int, vocab: int):
        self.length, self.vocab, self.start = length, vocab, 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            ids = torch.arange(self.start, self.start + self.length) % self.vocab
            ids = ids.to(torch.int32)
            yield ids, ids
            self.start += self.length


class _Postprocess:
    """fms-fsdp's postprocess chain as an fmsdata preprocess: one line in, named arrays
    out (keys sorted in output order, so tuple batches keep it)."""

    def __init__(self, steps: tuple[Callable[..., Any], ...]):
        self.steps = steps

    def __call__(self, line: np.ndarray, n_tokens: int) -> dict[str, np.ndarray]:
        out: Any = torch.from_numpy(line.astype(np.int32))
        for step in self.steps:
            out = step(out)
        parts = out if isinstance(out, (tuple, list)) else (out,)
        if not parts or any(isinstance(p, (Mapping, tuple, list)) for p in parts):
            raise ConfigError(
                "postprocess must end in a tensor or a tuple of tensors, got "
                f"{type(out).__name__} of {[type(p).__name__ for p in parts]}"
            )
        return {
            f"{i:03d}": p.numpy() if isinstance(p, torch.Tensor) else np.asarray(p)
            for i, p in enumerate(parts)
        }


def _nothing_to_resume(ckpt_load_path: str, load_from: str) -> str:
    message = f"resuming_dataset=True but {load_from!r} holds no complete fmsdata loader checkpoint"
    if not is_url(ckpt_load_path) and glob.glob(
        os.path.join(ckpt_load_path, "checkpoints", "*", "loader_state_*.pth")
    ):
        message += (
            "; the loader_state_*.pth files under checkpoints/ are fms-fsdp's own loader "
            "states: leave order unset (or pass order='fms-fsdp') to continue them in "
            "fms-fsdp's order"
        )
    return message + "; set resuming_dataset=False to start the data from the beginning"


def _tokenizer(path: Any, required: bool) -> str | None:
    """``tokenizer_path`` as a ``tokenizer.json``: the file, or the one in the folder."""
    if isinstance(path, (str, os.PathLike)):
        path = local_path(path, "tokenizer_path", TOKENIZER_HINT)
        candidate = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if os.path.isfile(candidate):
            return candidate
    if required:
        raise ConfigError(
            f"tokenizer_path={path!r} is neither a tokenizer.json nor a folder holding one "
            "(file_type hf_parquet tokenizes text with it; hub names are not downloaded)"
        )
    return None


def _loader_checkpoints(field: str, value: Any, write: bool = False) -> str:
    """``<value>/fmsdata_loader``: the folder of loader checkpoints under a checkpoint path
    (a local folder or a URL)."""
    return Folder(location(_path(field, value), field, write=write)).join(LOADER_CHECKPOINTS)


def _fms_order_paths(values: dict[str, Any]) -> None:
    """Refuse, by name, a URL among the folders order="fms-fsdp" reads and writes."""
    for field in ("data_path", "ckpt_save_path", "ckpt_load_path"):
        local_path(
            _path(field, values[field]),
            field,
            "order='fms-fsdp' reads and writes local (or shared) folders, as fms-fsdp does; "
            "order='fmsdata' takes URLs",
        )


def _path(field: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ConfigError(f"{field} must be a folder path, got {value!r}")
    return os.fspath(value)


def _int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{field} must be an integer, got {value!r}")
    return value


def _int_list(field: str, value: Any) -> list[int]:
    items = value.split(",") if isinstance(value, str) else list(value or ())
    try:
        return [int(str(item).strip()) for item in items if str(item).strip()]
    except ValueError:
        raise ConfigError(f"{field} must be a comma list of token ids, got {value!r}") from None
