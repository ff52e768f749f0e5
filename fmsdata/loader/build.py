"""``build_dataloader``: a rank's loader from a config, resumed from its automatic
checkpoints when they exist; and the advice it logs about a config that works but is
likely not what was meant.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from fmsdata.config import LoaderConfig, as_config
from fmsdata.data.rootconfig import resolve_config
from fmsdata.errors import ConfigError
from fmsdata.loader.dataloader import FmsDataLoader
from fmsdata.stages.shard import StageFactory
from fmsdata.worker.dataset import Preprocess, RankLineDataset
from fmsdata.worker.topology import Topology

__all__ = ["build_dataloader", "open_loader", "config_advice"]

logger = logging.getLogger(__name__)


def build_dataloader(
    config: LoaderConfig | Mapping[str, Any] | str | os.PathLike[str],
    rank: int | None = None,
    world_size: int | None = None,
    preprocess: Preprocess | None = None,
    stages: StageFactory | None = None,
) -> FmsDataLoader:
    """Build this rank's loader.

    Args:
        config: A ``LoaderConfig``, a dict of its fields, or a YAML file path. What it
            leaves unset that the root's ``metadata.json`` records (format, EOS id,
            vocabulary size) comes from there (``fmsdata.data.rootconfig``); the loader's
            ``config`` attribute is the completed one.
        rank: This process's rank; default from ``torch.distributed``, then ``RANK``.
        world_size: The number of ranks; default from ``torch.distributed``, then
            ``WORLD_SIZE``.
        preprocess: Optional per-line function run in the workers in place of the built-in
            causal-LM shift: ``preprocess(line, n_tokens) -> {name: array}``, where ``line``
            is the packed int64 line (``seq_length + 1`` tokens, padding after
            ``n_tokens``); batches then hold those names, stacked.
        stages: Builds each logical shard's chain of stages, ``stages(shard) -> Stage``
            (default ``fmsdata.stages.default_stages``; see ``fmsdata.stages`` for the
            protocol). A module-level function: workers receive it pickled. Its stages'
            settings are part of the state fingerprint.

    Returns:
        An ``FmsDataLoader`` yielding dicts with ``input_ids`` and ``labels`` of shape
        ``[batch_size, seq_length]`` (plus ``position_ids`` / ``cu_seqlens`` on request),
        or, with ``batch_format="tuple"`` in the config, ``(input_ids, labels, ...)``.

    Nothing but the root's ``metadata.json`` is read here: the data root is listed and
    checked, the chain the stage factory builds is checked and an automatic checkpoint
    (``checkpoint_dir``) is loaded at the loader's first use (iterating it, or taking,
    loading or asking its state, its ``steps`` or ``fingerprint``).

    Raises:
        ConfigError: Invalid config, more ranks than logical shards, a setting that
            contradicts the root's ``metadata.json`` (here); missing data (at first use).
        EmptyDatasetError: A dataset without documents (at first use).
    """
    topology = Topology.resolve(rank, world_size)
    loader = open_loader(config, topology, preprocess, stages)
    config = loader.config
    if config.logical_shards % topology.world_size:
        logger.warning(
            "logical_shards=%d is not a multiple of world_size=%d: ranks get unequal shard counts "
            "and batches are not world-size invariant",
            config.logical_shards,
            topology.world_size,
        )
    if topology.rank == 0:
        for advice in config_advice(config, topology.world_size):
            logger.warning(advice)
    return loader


def open_loader(
    config: LoaderConfig | Mapping[str, Any] | str | os.PathLike[str],
    topology: Topology,
    preprocess: Preprocess | None = None,
    stages: StageFactory | None = None,
) -> FmsDataLoader:
    """A rank's loader at the start of the run, its config completed from the root's
    ``metadata.json`` and checked; no advice logged (what ``build_dataloader`` adds).
    Like any loader it lists the data and loads an automatic checkpoint at its first use."""
    # Settings the root's metadata.json records fill what the config leaves unset.
    config = resolve_config(as_config(config))
    if preprocess is not None and (config.output_dtype != "int64" or config.ignore_first_labels):
        raise ConfigError(
            "output_dtype and ignore_first_labels shape the built-in outputs, which a "
            f"preprocess replaces: got output_dtype={config.output_dtype!r}, "
            f"ignore_first_labels={config.ignore_first_labels} with a preprocess"
        )
    if preprocess is not None and config.return_step_digest:
        raise ConfigError(
            "return_step_digest digests the built-in input_ids and labels, which a "
            "preprocess replaces: unset it, or digest your preprocess's outputs yourself"
        )
    return FmsDataLoader(RankLineDataset(config, topology, preprocess, stages))


def config_advice(config: LoaderConfig, world_size: int) -> list[str]:
    """Settings that work but are likely not what the user wants, each said in a sentence."""
    advice = []
    if config.bos_token is None and config.eos_token is None:
        advice.append(
            "neither bos_token nor eos_token is set: documents are packed back to back with "
            "nothing between them, so the model cannot see where one ends; set them to your "
            "tokenizer's ids (a tokenize root's metadata.json lists them), unless the "
            "documents already carry their own"
        )
    global_batch = world_size * config.batch_size
    if global_batch % config.logical_shards:
        # The smallest batch_size at least the configured one that fills whole rounds.
        step = config.logical_shards // math.gcd(world_size, config.logical_shards)
        fix = -(-config.batch_size // step) * step
        advice.append(
            f"global batch {world_size} x {config.batch_size} = {global_batch} is not a "
            f"multiple of logical_shards={config.logical_shards} (steps change if resumed on "
            f"another world size): use batch_size={fix} or fewer logical_shards"
        )
    return advice
