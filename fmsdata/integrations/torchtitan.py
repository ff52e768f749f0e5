"""fmsdata as a torchtitan data loader: ``FmsDataTorchtitanLoader``.

torchtitan's contract is ``torchtitan.components.dataloader.BaseDataLoader``: a
``Configurable`` whose nested ``Config`` the job config holds under ``dataloader``, built by
the trainer with ``config.dataloader.build(dp_world_size=..., dp_rank=..., tokenizer=...,
seq_len=..., local_batch_size=...)``, a DCP ``Stateful``, iterating
``(inputs_dict, labels)``. Here the trainer's ``seq_len`` and ``local_batch_size`` become
fmsdata's ``seq_length`` and ``batch_size``, its data-parallel rank and size (from its
``ParallelDims`` "batch" mesh) the loader's rank and world size, and the tokenizer's BOS/EOS
ids the loader's unless the fmsdata config sets them. In a job config::

    dataloader=FmsDataTorchtitanLoader.Config(
        dataset_path="/data/root", dataset="web,code", config_path="data.yaml"
    )

Checkpointing is torchtitan's own ``CheckpointManager``, unchanged. Its stock
``ParallelAwareDataloader`` keys state by ``dp_rank_<r>`` and asserts the data-parallel
size on load, so it cannot resume on another size; this loader instead returns every
data-parallel rank's state keyed by logical shard (``fmsdata.integrations.ranks``): the
keys are the same on every rank and every data-parallel size, DCP writes that entry once,
and each rank of a resumed run, on any data-parallel size, takes its logical shards from
it. The state is bytes, not tensors: DCP's default load
planner (the one the checkpointer uses) refuses a tensor whose saved size differs from the
live one, and a loader state's size is not known before it is read. DCP stores bytes as it
stores torchtitan's own loader state and ``train_state``; fmsdata parses them with its
state-file reader, which never unpickles.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import torch

from fmsdata.config import LoaderConfig
from fmsdata.errors import ConfigError
from fmsdata.integrations.ranks import carried_state, packed_union, resolve_dp
from fmsdata.loader import FmsDataLoader, build_dataloader
from fmsdata.util.extras import require

require("torchtitan", "fmsdata.integrations.torchtitan")

from torchtitan.components.dataloader import BaseDataLoader  # noqa: E402

__all__ = ["FmsDataTorchtitanLoader", "dp_from_parallel_dims", "loader_config"]

logger = logging.getLogger(__name__)

# What torchtitan's models read from the inputs dict; other batch entries keep their names.
_INPUT_KEY = "input"


def dp_from_parallel_dims(parallel_dims: Any) -> tuple[int, int]:
    """``(dp_rank, dp_world_size)`` as torchtitan's trainer derives them: the "batch" mesh
    of ``ParallelDims`` (data-parallel replicate x shard), or ``(0, 1)`` without data
    parallelism. For building the loader outside ``Trainer``."""
    if not parallel_dims.dp_enabled:
        return 0, 1
    mesh = parallel_dims.get_mesh("batch")
    return mesh.get_local_rank(), mesh.size()


def loader_config(config: Any, seq_len: int, local_batch_size: int, tokenizer: Any) -> LoaderConfig:
    """The fmsdata ``LoaderConfig`` a torchtitan ``Config`` describes.

    Fields come from ``config.config_path`` (an fmsdata YAML file), then ``dataset_path``
    and ``dataset``, then ``config.overrides`` (``key=value``); the trainer's ``seq_len`` and
    ``local_batch_size`` always win (they are torchtitan's data settings), and a tokenizer's
    ``bos_id`` / ``eos_id`` fill ``bos_token`` / ``eos_token`` the config leaves unset.

    Raises:
        ConfigError: No data root anywhere, ``batch_format`` other than ``"dict"``, or any
            invalid fmsdata field (naming it and the value).
    """
    where = "FmsDataTorchtitanLoader.Config"
    named: dict[str, Any] = {}
    if config.dataset_path:
        named["data_path"] = config.dataset_path
    if config.dataset:
        named["datasets"] = config.dataset
    if config.config_path:
        base = LoaderConfig.from_yaml(config.config_path).replace(**named)
    elif "data_path" in named:
        base = LoaderConfig.from_dict(named)
    else:
        raise ConfigError(
            f"{where}: set dataset_path (the data root) or config_path (an fmsdata YAML "
            "file with data_path)"
        )
    base = base.with_overrides(config.overrides)
    changes: dict[str, Any] = {"seq_length": seq_len, "batch_size": local_batch_size}
    for field, attribute in (("bos_token", "bos_id"), ("eos_token", "eos_id")):
        token = getattr(tokenizer, attribute, None) if tokenizer is not None else None
        if getattr(base, field) is None and token is not None:
            changes[field] = int(token)
    result = base.replace(**changes)
    if result.batch_format != "dict":
        raise ConfigError(
            f"{where}: batch_format must be 'dict', got {result.batch_format!r}: "
            "torchtitan iterates (inputs_dict, labels)"
        )
    return result


class FmsDataTorchtitanLoader(BaseDataLoader):
    """A torchtitan ``BaseDataLoader`` over ``fmsdata.build_dataloader``.

    Yields ``({"input": input_ids, ...}, labels)``: the batch's other entries
    (``position_ids``, ``cu_seqlens``, ``document_ids`` on request) keep their names in
    the inputs dict. ``state_dict()`` gathers every data-parallel rank's state (a
    collective: every process calls it, as DCP does); ``load_state_dict()`` resumes this
    rank from it on any data-parallel size dividing ``logical_shards``.

    Attributes:
        loader: The underlying ``FmsDataLoader`` (this rank's).
        dp_rank, dp_world_size: This rank's place in data parallelism.
    """

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        """torchtitan's dataloader config section for fmsdata.

        Attributes:
            dataset_path: fmsdata's ``data_path``: the data root.
            dataset: fmsdata's ``datasets``, comma-separated ("" = every dataset folder).
            config_path: An fmsdata YAML config for every other field (mix weights,
                logical shards, shuffle window, workers, ...).
            overrides: ``key=value`` fmsdata overrides applied last, as on the CLI.
        """

        config_path: str | None = None
        overrides: list[str] = dataclasses.field(default_factory=list)

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        seq_len: int,
        local_batch_size: int,
        tokenizer: Any = None,
        snapshot_every_n_steps: int | None = None,
    ) -> None:
        # snapshot_every_n_steps tunes StatefulDataLoader's snapshots; fmsdata's state is
        # always exact, so it is accepted and unused.
        del snapshot_every_n_steps
        self.dp_rank, self.dp_world_size = resolve_dp(
            dp_rank, dp_world_size, "FmsDataTorchtitanLoader"
        )
        settings = loader_config(config, seq_len, local_batch_size, tokenizer)
        self.loader: FmsDataLoader = build_dataloader(
            settings, rank=self.dp_rank, world_size=self.dp_world_size
        )

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        for batch in self.loader:
            inputs = dict(batch)
            labels = inputs.pop("labels")
            inputs = {_INPUT_KEY: inputs.pop("input_ids"), **inputs}
            yield inputs, labels

    def state_dict(self) -> dict[str, Any]:
        """Every data-parallel rank's state, keyed independently of the rank."""
        return carried_state(self.loader, self.dp_rank, self.dp_world_size)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume this rank from the states of every rank of a save (any data-parallel
        size). Raises ``StateMismatchError`` naming the entry, field and value."""
        where = "torchtitan checkpoint entry 'dataloader'"
        union = packed_union(state_dict, self.loader.config.logical_shards, where)
        self.loader.load_state_dict(union)

    def close(self) -> None:
        """Stop the loader's workers and open files."""
        self.loader.close()
