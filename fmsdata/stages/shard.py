"""What a stage factory builds one logical shard's chain from, and the default chain.

A logical shard's lines depend only on (data, config, seed, shard id). Its chain is built
by a *stage factory*: a function ``factory(shard: Shard) -> Stage`` called once per shard
in each worker. The default one reads like the fms-fsdp chains it replaces::

    def default_stages(shard):
        return shard.shuffle(shard.pack(shard.documents()))

documents -> (mixed by token share) -> packed into lines -> shuffled. Pass your own to
``build_dataloader(config, stages=...)`` to insert, replace or add stages (see
``fmsdata.stages`` for the protocol and an example); the factory must be a module-level
function (workers receive it pickled).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from fmsdata.config import (
    Decoration,
    DocumentsConfig,
    FimConfig,
    LinesConfig,
    LoaderConfig,
    MixConfig,
    ShardsConfig,
)
from fmsdata.errors import ConfigError
from fmsdata.stages.base import SpanStage, Stage
from fmsdata.stages.bestfit import BestFitPacker
from fmsdata.stages.documents import DocumentStream, stream_class
from fmsdata.stages.fim import FillInMiddle
from fmsdata.stages.mixing import TokenShareMixer
from fmsdata.stages.packing import LinePacker
from fmsdata.stages.schedule import WeightSchedule
from fmsdata.stages.shuffle import ShuffleBuffer
from fmsdata.stages.source import DocumentSource
from fmsdata.util.permute import derive_key

__all__ = ["Shard", "ShardRecipe", "StageFactory", "default_stages", "weight_schedule"]


@dataclasses.dataclass(frozen=True)
class ShardRecipe:
    """Everything a shard pipeline is built from: the dataset names and their weight
    schedule, and the config sections that shape a shard's lines, taken whole.

    Attributes:
        names: The mixed datasets, in the mix's order.
        schedule: Their weights over a logical shard's clock (``weight_schedule``).
        shards: Logical shards and seed (every order is keyed by them).
        documents: Document delimiters, stripping, length floor and order.
        lines: Line length, delimiters, packing mode and shuffle window.
        fim: Fill-in-the-middle settings, None when ``fim_training`` is off.
    """

    names: tuple[str, ...]
    schedule: WeightSchedule
    shards: ShardsConfig
    documents: DocumentsConfig
    lines: LinesConfig
    fim: FimConfig | None = None

    @staticmethod
    def from_config(config: LoaderConfig, names: Sequence[str]) -> ShardRecipe:
        return ShardRecipe(
            names=tuple(names),
            schedule=weight_schedule(config.mix, len(names), config.shards, config.lines),
            shards=config.shards,
            documents=config.documents,
            lines=config.lines,
            fim=config.fim if config.fim.fim_training else None,
        )

    @property
    def seed(self) -> int:
        return self.shards.seed

    @property
    def n_shards(self) -> int:
        return self.shards.logical_shards

    @property
    def decoration(self) -> Decoration:
        """What the documents section does to each document's tokens."""
        return self.documents.decoration

    @property
    def capacity(self) -> int:
        """Document tokens a line holds (``LinesConfig.content_capacity``)."""
        return self.lines.content_capacity

    @property
    def packing(self) -> str:
        return self.lines.packing

    @property
    def window(self) -> int:
        """Lines of the shuffle buffer: none with stored document order."""
        return 0 if self.document_order == "sequential" else self.lines.shuffle_window

    @property
    def document_order(self) -> str:
        return self.documents.document_order

    @property
    def frame(self) -> tuple[int, ...]:
        """The line and document delimiters (BOL, BOS, EOS, EOL) that fill-in-the-middle
        keeps at a piece's edges."""
        delimiters = (
            self.lines.bol_token,
            self.documents.bos_token,
            self.documents.eos_token,
            self.lines.eol_token,
        )
        return tuple(t for t in delimiters if t is not None)


def weight_schedule(
    mix: MixConfig, n_datasets: int, shards: ShardsConfig, lines: LinesConfig
) -> WeightSchedule:
    """The mix's weights as a function of a logical shard's clock."""
    if mix.weight_schedule is None:
        return WeightSchedule.constant(mix.weights or (1.0,) * n_datasets)
    fraction = 1.0 / shards.logical_shards
    if mix.schedule_unit == "steps":
        # A step is global_batch_size lines, each holding content_capacity document tokens
        # (seq_length + 1 for the causal shift, less the line delimiters). With pad or
        # best_fit packing lines hold fewer: a step point then takes effect later by the
        # padding's share.
        assert mix.global_batch_size is not None, "validated by the config"
        fraction *= mix.global_batch_size * lines.content_capacity
    return WeightSchedule.from_points(
        mix.weight_schedule,
        fraction,
        linear=mix.schedule_interpolation == "linear",
        resolution=mix.schedule_resolution,
    )


@dataclasses.dataclass(frozen=True)
class Shard:
    """What a stage factory builds one logical shard's chain from.

    Attributes:
        id: The logical shard.
        recipe: What the config says about lines (its ``shards``, ``documents``,
            ``lines`` and ``fim`` sections, and what follows from them: ``capacity``,
            ``packing``, ``window``, ``seed``, ``decoration``), the dataset ``names`` and
            weight ``schedule``.
        accesses: The datasets' files in this process, mixed ones first in recipe order.
    """

    id: int
    recipe: ShardRecipe
    accesses: Sequence[Any]

    def key(self, *parts: Any) -> int:
        """A random key of this run and shard, for a stage's own randomness."""
        return derive_key(self.recipe.seed, *parts, self.id)

    def streams(self, order: type[DocumentStream] | None = None) -> list[DocumentStream]:
        """Each mixed dataset's documents in this shard (recipe order): a seeded walk per
        epoch or stored order (config ``document_order``), or the given ``DocumentStream``
        subclass (another document order). A dataset too small to give each shard a
        line's worth of documents rotates its portions over the shards' epochs
        (``fmsdata.stages.documents``)."""
        r = self.recipe
        cls = order or stream_class(r.document_order)
        if not (isinstance(cls, type) and issubclass(cls, DocumentStream)):
            raise ConfigError(
                f"a document order is a DocumentStream subclass, got {cls!r} (an order with "
                "parameters: a subclass with them as class attributes, one per setting)"
            )
        if cls.walk_order is DocumentStream.walk_order:
            raise ConfigError(
                f"document order {cls.__module__}.{cls.__qualname__} does not define walk_order "
                "(fragments, cycle) -> WalkOrder: the order a cycle reads its fragments in"
            )
        return [
            cls(access, self.id, r.n_shards, r.seed, r.decoration, r.capacity, dataset=d)
            for d, access in enumerate(self.accesses[: len(r.names)])
        ]

    def mix(self, streams: Sequence[DocumentSource]) -> TokenShareMixer:
        """Document sources (one per dataset, recipe order) mixed by token share."""
        return TokenShareMixer(streams, self.recipe.names, self.recipe.schedule)

    def documents(self, order: type[DocumentStream] | None = None) -> TokenShareMixer:
        """The shard's documents of every dataset, mixed by token share: the chain's
        document source, which the packer reads (``mix(streams(order))``)."""
        return self.mix(self.streams(order))

    def pack(self, source: DocumentSource) -> LinePacker | BestFitPacker:
        """Documents packed into lines of ``seq_length + 1`` tokens (config ``packing``:
        ``best_fit`` over windows of ``pack_window`` documents, ``hard`` or ``pad``)."""
        r = self.recipe
        if r.packing == "best_fit":
            return BestFitPacker(source, r.capacity, r.lines.pack_window)
        return LinePacker(source, r.capacity, r.packing)

    def shuffle(self, source: SpanStage) -> ShuffleBuffer:
        """Lines shuffled in a window of ``shuffle_window`` lines."""
        return ShuffleBuffer(source, self.recipe.window, self.key("shuffle"))

    def fim(self, source: Stage, settings: FimConfig | None = None) -> FillInMiddle:
        """Fill-in-the-middle on every line (the config's ``fim`` section unless given),
        its randomness keyed by (seed, this shard, line); the line's delimiters stay at
        the pieces' edges."""
        s = settings or self.recipe.fim
        if s is None:
            raise ConfigError("Shard.fim needs FIM settings: set fim_training or pass them")
        return FillInMiddle(
            source,
            self.key("fim"),
            s.psm_rate,
            s.spm_rate,
            s.fim_pre,
            s.fim_mid,
            s.fim_suf,
            s.fim_min_length,
            self.recipe.frame,
        )


StageFactory = Callable[[Shard], Stage]


def default_stages(shard: Shard) -> Stage:
    """documents -> mix -> pack -> shuffle (-> fill-in-the-middle with ``fim_training``):
    the chain a loader runs unless told otherwise."""
    top = shard.shuffle(shard.pack(shard.documents()))
    return shard.fim(top) if shard.recipe.fim is not None else top
