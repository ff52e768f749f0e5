"""fms-fsdp ``mamba-new`` order as one fmsdata dataset: its stages chained per physical
worker, its postprocess, its checkpoint cadence.

Per physical worker ``p`` of ``P`` (rank ``r`` of ``W``; with ``N >= 2`` DataLoader
workers ``p = r*N + w``, ``P = W*N``; 0 and 1 workers are the same stream): per dataset a
``ShardMix`` of its logical shards' ``DocStream``\\s, a ``DatasetMix`` over them, a
``Packer`` to ``seq_length (+1 with causal_lm)`` tokens, a ``PreloadBuffer`` of 10,000
lines, then ``torch.IntTensor`` and the postprocess steps.

Checkpoints, like fms-fsdp's, are written by whoever produces the lines when batch
``N+1`` starts, holding ``N`` batches of that producer, every ``checkpoint_interval``:
``ckpt_save_path/fmsdata_fms_order/step_<N>_ckp/loader_state_<p>.fms`` (fmsdata's
state files: JSON and ``.npy`` in a zip, never unpickled). Unlike fms-fsdp's they also
hold where each logical shard's pass started, so resuming continues the uninterrupted
stream exactly. Where a worker resumes from: ``fms_resume_source``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.state.file import load_state, save_state

from .arrowdocs import ArrowDocs
from .docstream import DocStream
from .fim import FimStep
from .fmsstate import find_step_folder, from_fms, load_fms_file, reshard, shard_files
from .layout import dataset_name, list_files, logical_docs, meta_counts
from .packing import Packer
from .preload import PreloadBuffer
from .sampling import DatasetMix
from .shardmix import ShardMix
from .spans import Tokens

__all__ = ["OWN_CHECKPOINTS", "WINDOW", "FmsOrderDataset", "fms_resume_source"]

logger = logging.getLogger(__name__)

OWN_CHECKPOINTS = "fmsdata_fms_order"
WINDOW = 10000  # fms-fsdp's PreloadBufferDataset size in get_data_loader
_SUFFIX = ".fms"
_VERSION = 2  # 2: buffered lines saved as spans of the documents
_SOURCES = (("own", OWN_CHECKPOINTS, _SUFFIX), ("fms", "checkpoints", ".pth"))
# the fields a saved state must have been saved with (with the line length) to continue
_FINGERPRINT = """datasets weights seq_length logical_shards seed eos_token bos_token bol_token
    eol_token strip_tokens col_name fim_training psm_rate spm_rate fim_pre fim_mid
    fim_suf""".split()


def fms_resume_source(values: dict[str, Any]) -> tuple[str, str, int] | None:
    """``(kind, folder, step)`` a worker would resume from: ``"own"`` (fmsdata's saves
    in this order), ``"fms"`` (fms-fsdp's) or None; ``step`` is the step count kept.
    fms-fsdp's rule (``fmsstate``), fmsdata's own saves looked for first in each place."""
    places = [(values["ckpt_save_path"], True)]
    if values["resuming_dataset"]:
        places.append((values["ckpt_load_path"], False))
    for root, keep_step in places:
        for kind, sub, suffix in _SOURCES:
            found = find_step_folder(os.path.join(root, sub), suffix)
            if found:
                return kind, found[0], found[1] if keep_step else 0
    return None


class _Chain:
    """One physical worker's stages."""

    def __init__(self, values: dict[str, Any], p: int, world: int, rank: int, length: int):
        eos, bos = values["eos_token"], values["bos_token"]
        strip = {int(x) for x in str(values["strip_tokens"]).split(",") if x.strip()}
        strip |= {t for t in (bos, eos, values["bol_token"], values["eol_token"]) if t is not None}
        cols = _split(values["col_name"])
        paths: list[str] = []  # the file table: buffered lines name files by position
        names: list[str] = []
        reader = ArrowDocs(paths, tuple(cols), frozenset(strip))
        self.tokens = Tokens(reader, names)
        n_shards = values["logical_shards"]
        if n_shards <= 0 or n_shards % world:
            raise ConfigError(
                f"logical_shards={n_shards} must be a positive multiple of world size times "
                f"DataLoader workers ({world}), as fms-fsdp requires"
            )
        per = n_shards // world
        mixes = []
        self.datasets = _split(values["datasets"])
        for name in self.datasets:
            folder = os.path.join(values["data_path"], name)
            files = list_files(folder)
            file_ids = {f: len(paths) + i for i, f in enumerate(files)}
            paths += [os.path.join(folder, f) for f in files]
            names += [f"{name}/{f}" for f in files]
            counts = meta_counts(folder) or {f: reader.count(file_ids[f]) for f in files}
            _, short = dataset_name(folder)
            streams = [
                DocStream(
                    folder,
                    short,
                    logical_docs(files, counts, k, n_shards, values["seed"]),
                    k,
                    values["seed"],
                    reader,
                    file_ids,
                    eos,
                    bos,
                )
                for k in range(p * per, (p + 1) * per)
            ]
            mixes.append(ShardMix(streams, p, eos, folder))
        weights = [float(w) for w in _split(values["weights"])]
        if len(weights) != len(mixes) or any(w <= 0 for w in weights):
            raise ConfigError(
                f"weights={values['weights']!r} must be one positive number per dataset "
                f"({len(mixes)})"
            )
        self.mix = DatasetMix(mixes, weights, eos)
        self.packer = Packer(
            self.mix.next_chunk, self.tokens, length, values["bol_token"], values["eol_token"]
        )
        self.preload = PreloadBuffer(self.packer.next_line, self.tokens, WINDOW, rank)
        self.fim: FimStep | None = None
        if values["fim_training"]:
            if bos is not None:
                raise ConfigError(
                    f"fim_training with bos_token={bos!r}: mamba-fim allows no BOS in FIM "
                    "training (use fim_pre)"
                )
            self.fim = FimStep(values, rank)

    def state(self) -> dict[str, Any]:
        out = {
            "preload": self.preload.state(),
            "packer": self.packer.state(),
            "mix": self.mix.state(),
        }
        if self.fim is not None:
            out["fim"] = self.fim.state()
        return out

    def load(self, state: dict[str, Any], whole: bool, where: str) -> None:
        self.preload.load(state["preload"], whole, f"{where}: preload")
        self.packer.load(state["packer"], whole, f"{where}: packer")
        self.mix.load(state["mix"], whole)
        if self.fim is not None:
            self.fim.load(state.get("fim") or {}, whole)

    def next_line(self) -> np.ndarray:
        """The next output line's tokens (int32), FIM applied when configured."""
        line = self.tokens.materialize(self.preload.next_line(), self.packer.length)
        return line if self.fim is None else self.fim(line)


def _split(value: Any) -> list[str]:
    if isinstance(value, str):
        return [x.strip() for x in value.split(",")]
    if isinstance(value, (list, tuple)):
        return [str(x) for x in value]
    return [str(value)]


class FmsOrderDataset(IterableDataset):
    """Lines in fms-fsdp order for one rank, postprocessed; saves and resumes itself.

    Args:
        values: fms-fsdp ``train_config`` loader fields (``train_config_values``).
        rank, world_size: This process's place in the job.
        postprocess: Applied in order to each int32 line.
        length: Tokens per line before postprocess.
    """

    def __init__(
        self,
        values: dict[str, Any],
        rank: int,
        world_size: int,
        postprocess: Sequence[Callable[..., Any]],
        length: int,
    ):
        self.values, self.rank, self.world_size = dict(values), rank, world_size
        self.postprocess, self.length = tuple(postprocess), length
        self.fingerprint = {key: values[key] for key in _FINGERPRINT} | {"length": length}

    def _place(self) -> tuple[int, int]:
        info = get_worker_info()
        if info is None or info.num_workers == 1:
            return self.rank, self.world_size
        return self.rank * info.num_workers + info.id, self.world_size * info.num_workers

    def build(self) -> tuple[_Chain, int, int]:
        """This worker's chain, resumed; with its physical rank and step count."""
        p, world = self._place()
        chain = _Chain(self.values, p, world, self.rank, self.length)
        source = fms_resume_source(self.values)
        step = 0
        if source is not None:
            kind, folder, step = source
            self._resume(chain, kind, folder, p, world)
            logger.info(
                "rank %d worker %d: data resumed in fms-fsdp order from %s", self.rank, p, folder
            )
        return chain, p, step

    def _resume(self, chain: _Chain, kind: str, folder: str, p: int, world: int) -> None:
        suffix = _SUFFIX if kind == "own" else ".pth"
        paths, n_files = shard_files(folder, suffix, p, world)
        if kind == "own":
            states = [self._load_own(path) for path in paths]
        else:
            states = [from_fms(load_fms_file(path), path) for path in paths]
        if n_files == world:
            chain.load(states[0], whole=True, where=paths[0])
            return
        # fms-fsdp's rescale re-deals the buffered lines; fmsdata's own states hold them as
        # spans, decoded (and checked) per file, dealt, then encoded for the new buffer
        buffers = [
            chain.tokens.lines(s["preload"]["buffer"], f"{path}: preload.buffer")
            if kind == "own"
            else s["preload"]["buffer"]
            for s, path in zip(states, paths, strict=True)
        ]
        lines = reshard(buffers, n_files, p, world, folder)
        merged: dict[str, Any] = {
            "preload": {
                "g_state": None,
                "buffer": chain.tokens.encode(lines) if kind == "own" else lines,
            },
            "packer": {"buffer": []},
            "mix": {"sample_iterator_states": []},
        }
        # fms-fsdp's rescale restarts each logical shard's pass where its state says;
        # fmsdata's own states rescale the same way, so without ``origin``
        for s in states:
            for sub in s["mix"]["sample_iterator_states"]:
                for shard in sub["logical_shard_states"]:
                    shard.pop("origin", None)
        for i in range(len(chain.datasets)):
            subs = [s["mix"]["sample_iterator_states"][i] for s in states]
            merged["mix"]["sample_iterator_states"].append(
                {
                    key: reshard([sub[key] for sub in subs], n_files, p, world, folder)
                    for key in ("n_docs_remaining", "logical_shard_states")
                }
            )
        chain.load(merged, whole=False, where=folder)

    def _load_own(self, path: str) -> dict[str, Any]:
        state = load_state(path)
        if state.get("version") != _VERSION or state.get("order") != "fms-fsdp":
            raise StateMismatchError(
                f"{path}: not an fmsdata fms-fsdp-order state (version {_VERSION})"
            )
        for key, value in self.fingerprint.items():
            saved = state["fingerprint"].get(key)
            if saved != value:
                raise StateMismatchError(
                    f"{path}: saved with {key}={saved!r}, this config has {key}={value!r}"
                )
        return state["chain"]

    def _save(self, chain: _Chain, p: int, step: int) -> None:
        folder = os.path.join(self.values["ckpt_save_path"], OWN_CHECKPOINTS, f"step_{step}_ckp")
        os.makedirs(folder, exist_ok=True)
        state = {
            "version": _VERSION,
            "order": "fms-fsdp",
            "fingerprint": self.fingerprint,
            "step": step,
            "chain": chain.state(),
        }
        save_state(os.path.join(folder, f"loader_state_{p}{_SUFFIX}"), state)

    def __iter__(self) -> Iterator[Any]:
        chain, p, step = self.build()
        interval = self.values["checkpoint_interval"]
        batch = self.values["batch_size"]
        ministep = 0
        while True:
            out: Any = torch.from_numpy(chain.next_line())
            for fn in self.postprocess:
                out = fn(out)
            yield out
            ministep += 1
            if ministep == batch:
                ministep = 0
                step += 1
                if interval > 0 and step % interval == 0:
                    self._save(chain, p, step)
