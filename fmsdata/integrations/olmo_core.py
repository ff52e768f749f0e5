"""fmsdata as an OLMo-core data loader: ``FmsDataLoaderConfig`` builds ``FmsDataOLMoLoader``.

OLMo-core's contract is ``olmo_core.data.DataLoaderBase`` (``state_dict``,
``load_state_dict``, ``reshuffle``, ``_iter_batches``, ``total_batches``,
``get_mock_batch``), built from a config object with ``config.build(..., mesh=...)`` or
``dp_process_group=...``, the global batch size counted in tokens. Here
``FmsDataLoaderConfig`` is that config: ``build(mesh=..., dp_process_group=...)`` takes the
data-parallel rank and size as OLMo-core's own loaders do (``get_rank`` / ``get_world_size``
of the data-parallel process group), and each rank's fmsdata ``batch_size`` is
``global_batch_size // (sequence_length * dp_world_size)``. Batches are dicts with
``input_ids`` and ``labels`` (plus ``position_ids`` etc. on request), as OLMo-core's train
modules read them::

    data_loader = FmsDataLoaderConfig(
        data_path="/data/root", datasets="web,code", config_path="data.yaml",
        sequence_length=4096, global_batch_size=1024 * 4096,
    ).build(dp_process_group=train_module.dp_process_group)
    trainer = trainer_config.build(train_module, data_loader)

Checkpointing is OLMo-core's own ``Checkpointer``, unchanged: ``Trainer.state_dict()``
holds ``data_loader.state_dict()`` in ``train/rank<r>.pt`` of every rank, and on load a
rank reads its own file or, when it is missing (another world size), ``rank0.pt``. OLMo's
own loaders survive that because their state is global; fmsdata's is per rank, so this
loader's ``state_dict()`` carries every data-parallel rank's state
(``fmsdata.integrations.ranks``) and each file, ``rank0.pt`` included, resumes any rank on
any data-parallel size dividing ``logical_shards``.

fmsdata's loader runs its own epochs (each logical shard starts its next epoch when it
ends), so an OLMo-core epoch here never ends: give the trainer ``max_duration`` in steps
or tokens. ``reshuffle`` is a no-op and ``total_batches`` is None.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable
from typing import Any

import torch

from fmsdata.config import LoaderConfig
from fmsdata.errors import ConfigError
from fmsdata.integrations.ranks import carried_state, packed_union, resolve_dp
from fmsdata.loader import FmsDataLoader, build_dataloader
from fmsdata.util.extras import require

require("olmo_core", "fmsdata.integrations.olmo_core")

from olmo_core.config import Config  # noqa: E402
from olmo_core.data import DataLoaderBase  # noqa: E402
from olmo_core.distributed.parallel import get_dp_process_group  # noqa: E402
from olmo_core.distributed.utils import get_fs_local_rank, get_rank, get_world_size  # noqa: E402

__all__ = ["FmsDataLoaderConfig", "FmsDataOLMoLoader"]


@dataclasses.dataclass
class FmsDataLoaderConfig(Config):
    """OLMo-core config for an fmsdata loader.

    Attributes:
        data_path: fmsdata's data root.
        sequence_length: Tokens per sequence (fmsdata's ``seq_length``).
        global_batch_size: Tokens per global step, as OLMo-core counts it: a multiple of
            ``sequence_length * dp_world_size``.
        datasets: fmsdata's ``datasets``, comma-separated (None = every dataset folder).
        config_path: An fmsdata YAML config for every other field (mix weights, logical
            shards, shuffle window, workers, ...).
        overrides: ``key=value`` fmsdata overrides applied last, as on the CLI.
        work_dir: OLMo-core's local working directory (default: the temporary folder).
    """

    data_path: str
    sequence_length: int
    global_batch_size: int
    datasets: str | None = None
    config_path: str | None = None
    overrides: list[str] = dataclasses.field(default_factory=list)
    work_dir: str | None = None

    def loader_config(self, dp_world_size: int) -> LoaderConfig:
        """The fmsdata ``LoaderConfig`` for one rank of ``dp_world_size``.

        Raises:
            ConfigError: ``global_batch_size`` not a multiple of ``sequence_length *
                dp_world_size``, ``batch_format`` other than ``"dict"``, or any invalid
                fmsdata field (naming it and the value).
        """
        where = "FmsDataLoaderConfig"
        per_step = self.sequence_length * dp_world_size
        if self.global_batch_size <= 0 or self.global_batch_size % per_step:
            raise ConfigError(
                f"{where}: global_batch_size {self.global_batch_size} (tokens) is not a positive "
                f"multiple of sequence_length {self.sequence_length} x dp_world_size "
                f"{dp_world_size} = {per_step}"
            )
        named: dict[str, Any] = {"data_path": self.data_path}
        if self.datasets:
            named["datasets"] = self.datasets
        if self.config_path:
            base = LoaderConfig.from_yaml(self.config_path).replace(**named)
        else:
            base = LoaderConfig.from_dict(named)
        base = base.with_overrides(self.overrides).replace(
            seq_length=self.sequence_length, batch_size=self.global_batch_size // per_step
        )
        if base.batch_format != "dict":
            raise ConfigError(
                f"{where}: batch_format must be 'dict', got {base.batch_format!r}: OLMo-core "
                "train modules read batch['input_ids']"
            )
        return base

    def build(
        self, *, mesh: Any = None, dp_process_group: Any = None, **kwargs: Any
    ) -> FmsDataOLMoLoader:
        """This rank's loader, data-parallel rank and size from ``mesh`` (its data-parallel
        process group) or ``dp_process_group`` (default: the whole world)."""
        del kwargs  # OLMo-core's build() takes e.g. a collator; fmsdata batches itself
        if dp_process_group is None and mesh is not None:
            dp_process_group = get_dp_process_group(mesh)
        dp_rank, dp_world_size = get_rank(dp_process_group), get_world_size(dp_process_group)
        return FmsDataOLMoLoader(
            self.loader_config(dp_world_size),
            work_dir=self.work_dir or tempfile.gettempdir(),
            global_batch_size=self.global_batch_size,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            fs_local_rank=get_fs_local_rank(),
        )


class FmsDataOLMoLoader(DataLoaderBase):
    """An OLMo-core ``DataLoaderBase`` over ``fmsdata.build_dataloader``.

    ``state_dict()`` gathers every data-parallel rank's state (a collective: every process
    calls it, as ``Trainer.state_dict()`` does on every rank). ``batches_processed`` counts
    this run's batches for OLMo-core's bookkeeping; the data position is fmsdata's own.

    Attributes:
        loader: The underlying ``FmsDataLoader`` (this rank's).
    """

    def __init__(
        self,
        config: LoaderConfig,
        *,
        work_dir: str,
        global_batch_size: int,
        dp_world_size: int = 1,
        dp_rank: int = 0,
        fs_local_rank: int | None = None,
    ) -> None:
        resolve_dp(dp_rank, dp_world_size, "FmsDataOLMoLoader")
        super().__init__(
            work_dir=work_dir,
            global_batch_size=global_batch_size,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            fs_local_rank=fs_local_rank,
        )
        self.loader: FmsDataLoader = build_dataloader(
            config, rank=dp_rank, world_size=dp_world_size
        )

    @property
    def total_batches(self) -> int | None:
        """Unknown: fmsdata's epochs are per logical shard, not one global count."""
        return None

    def _iter_batches(self) -> Iterable[dict[str, Any]]:
        return iter(self.loader)

    def reshuffle(self, epoch: int | None = None, **kwargs: Any) -> None:
        """Record the epoch; fmsdata's order is already a function of (seed, epoch, shard)."""
        del kwargs
        self._epoch = 1 if epoch is None else epoch

    def state_dict(self) -> dict[str, Any]:
        """Every data-parallel rank's state, keyed by logical shard."""
        return carried_state(self.loader, self.dp_rank, self.dp_world_size)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume this rank from the states of every rank of a save (any data-parallel
        size). Raises ``StateMismatchError`` naming the entry, field and value."""
        where = "OLMo-core trainer state entry 'data_loader'"
        self.loader.load_state_dict(
            packed_union(state_dict, self.loader.config.logical_shards, where)
        )

    def get_mock_batch(self) -> dict[str, Any]:
        """A batch of this rank's shape with token 0, for the trainer's dry run."""
        config = self.loader.config
        shape = (config.batch_size, config.seq_length)
        dtype = getattr(torch, config.output_dtype)
        return {
            "input_ids": torch.zeros(shape, dtype=dtype),
            "labels": torch.zeros(shape, dtype=dtype),
        }

    def global_num_tokens_in_batch(self, batch: dict[str, Any]) -> int | None:
        """Tokens of the global step (every rank's batch has this rank's shape)."""
        return int(batch["input_ids"].numel()) * self.dp_world_size

    def close(self) -> None:
        """Stop the loader's workers and open files."""
        self.loader.close()
