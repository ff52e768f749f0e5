"""fmsdata as a PyTorch Lightning data module: ``FmsDataModule``.

Lightning's contract for data with state is a ``LightningDataModule`` whose
``state_dict()`` goes into the checkpoint (``checkpoint[<class qualname>]``) and whose
``load_state_dict()`` gets it back before ``train_dataloader()`` is built. Here the module
builds ``fmsdata.build_dataloader`` in ``train_dataloader()``, with the data-parallel rank
and size of the trainer's strategy (``strategy.distributed_sampler_kwargs``: ``rank`` and
``num_replicas``, the data-parallel ones also under model parallelism; else
``trainer.global_rank`` / ``trainer.world_size``)::

    datamodule = FmsDataModule("data.yaml", global_batch_size=1024)
    trainer.fit(model, datamodule=datamodule, ckpt_path=...)

Checkpointing is Lightning's own, unchanged. Two things in it would lose data with a
per-rank loader state, and both are handled here:

- The checkpoint file is written by global rank 0 only, and every rank of a resumed run
  reads that one file. So ``state_dict()`` carries every data-parallel rank's state
  (``fmsdata.integrations.ranks``), and each rank takes the logical shards it now owns.
- Lightning's fetcher pulls one batch ahead of training when the loader has no length, so a
  loader's live position at checkpoint time is one batch past what was trained. The
  iterable handed to Lightning has a length (``epoch_batches``, large by default), which
  turns that prefetch off: the position saved is exactly the batches trained.

The iterable's own ``state_dict`` is empty: Lightning saves a loader's state from rank 0
only and loads that one into every rank, so the positions live in the data module's state
(every rank's) instead. It has one at all because Lightning calls a loader without
``state_dict`` / ``load_state_dict`` "not resumable" and warns of "unreliable results" on
every resume taken mid-epoch, which with fmsdata is every resume and is exact. fmsdata's
loader runs its own epochs, so a Lightning epoch is just ``epoch_batches`` batches; stop
training with ``max_steps``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from fmsdata.config import LoaderConfig, as_config
from fmsdata.errors import ConfigError
from fmsdata.integrations.ranks import FORMAT, carried_state, packed_union, resolve_dp
from fmsdata.loader import FmsDataLoader, build_dataloader
from fmsdata.util.extras import require

require("pytorch_lightning", "fmsdata.integrations.lightning")

from pytorch_lightning import LightningDataModule  # noqa: E402

__all__ = ["FmsDataModule"]

DEFAULT_EPOCH_BATCHES = 2**31 - 1


class _Batches:
    """What ``train_dataloader()`` returns: the loader's batches with a length (so Lightning
    does not prefetch) and an empty state (the data module holds every rank's)."""

    def __init__(self, loader: FmsDataLoader, length: int):
        self.loader = loader
        self.length = length

    def __len__(self) -> int:
        return self.length

    def state_dict(self) -> dict[str, Any]:
        """Nothing: Lightning would save this from rank 0 only and hand it to every rank;
        ``FmsDataModule.state_dict`` carries every rank's position instead. Having the
        method is what makes Lightning count the loader as resumable."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to load: ``FmsDataModule.load_state_dict`` has loaded the position."""

    def __iter__(self) -> Iterator[Any]:
        for done, batch in enumerate(self.loader, start=1):
            yield batch
            if done == self.length:
                return


class FmsDataModule(LightningDataModule):
    """A ``LightningDataModule`` over ``fmsdata.build_dataloader``.

    Args:
        config: An fmsdata ``LoaderConfig``, a dict of its fields, or a YAML path.
        global_batch_size: Sequences per global step; each rank's ``batch_size`` becomes
            ``global_batch_size // dp_world_size`` (which must divide it), so the global
            batch, and the global steps, stay the same on any number of devices. None keeps
            the config's per-rank ``batch_size``.
        epoch_batches: Batches per Lightning epoch (fmsdata's own epochs are per logical
            shard and continue across Lightning epochs).

    Attributes:
        loader: The underlying ``FmsDataLoader`` (this rank's), once
            ``train_dataloader()`` has built it.
    """

    def __init__(
        self,
        config: LoaderConfig | Mapping[str, Any] | str,
        global_batch_size: int | None = None,
        epoch_batches: int = DEFAULT_EPOCH_BATCHES,
    ) -> None:
        super().__init__()
        self.config = as_config(config)
        if self.config.batch_format != "dict":
            raise ConfigError(
                f"FmsDataModule: batch_format must be 'dict', got {self.config.batch_format!r}"
            )
        if global_batch_size is not None and global_batch_size < 1:
            raise ConfigError(
                f"FmsDataModule: global_batch_size must be positive, got {global_batch_size!r}"
            )
        if epoch_batches < 1:
            raise ConfigError(
                f"FmsDataModule: epoch_batches must be positive, got {epoch_batches!r}"
            )
        self.global_batch_size = global_batch_size
        self.epoch_batches = epoch_batches
        self.loader: FmsDataLoader | None = None
        self._pending: dict[str, bytes] | None = None
        self._dp: tuple[int, int] | None = None

    def data_parallel(self) -> tuple[int, int]:
        """``(dp_rank, dp_world_size)`` from the attached trainer's strategy."""
        trainer = self.trainer
        if trainer is None:
            raise ConfigError(
                "FmsDataModule: not attached to a Trainer (pass it to trainer.fit(datamodule=...))"
            )
        sampler = getattr(trainer.strategy, "distributed_sampler_kwargs", None)
        if sampler and "rank" in sampler and "num_replicas" in sampler:
            rank, size = sampler["rank"], sampler["num_replicas"]
        else:
            rank, size = trainer.global_rank, trainer.world_size
        return resolve_dp(rank, size, f"FmsDataModule ({type(trainer.strategy).__name__})")

    def _build(self) -> FmsDataLoader:
        if self.loader is None:
            self._dp = self.data_parallel()
            dp_rank, dp_world_size = self._dp
            config = self.config
            if self.global_batch_size is not None:
                if self.global_batch_size % dp_world_size:
                    raise ConfigError(
                        f"FmsDataModule: global_batch_size {self.global_batch_size} is not a "
                        f"multiple of the data-parallel size {dp_world_size}"
                    )
                config = config.replace(batch_size=self.global_batch_size // dp_world_size)
            self.loader = build_dataloader(config, rank=dp_rank, world_size=dp_world_size)
            if self._pending is not None:
                self.loader.load_state_dict(self._pending)
                self._pending = None
        return self.loader

    def train_dataloader(self) -> _Batches:
        """This rank's batches (dicts with ``input_ids``, ``labels``, ...)."""
        return _Batches(self._build(), self.epoch_batches)

    def state_dict(self) -> dict[str, Any]:
        """Every data-parallel rank's state, keyed by logical shard; a state loaded but not
        yet applied as it was; empty before training (Lightning then saves nothing)."""
        if self.loader is None or self._dp is None:
            if self._pending is None:
                return {}
            return {"format": FORMAT, **self._pending}
        return carried_state(self.loader, *self._dp)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from the states of every rank of a save (any data-parallel size); applied
        when the loader is built. Raises ``StateMismatchError`` naming the entry, field and
        value."""
        where = f"Lightning checkpoint entry {type(self).__qualname__!r}"
        self._pending = packed_union(state_dict, self.config.logical_shards, where)
        if self.loader is not None:
            self.loader.load_state_dict(self._pending)
            self._pending = None

    def teardown(self, stage: str) -> None:
        """Stop the loader's workers and open files (its position is kept)."""
        if self.loader is not None:
            self.loader.close()
