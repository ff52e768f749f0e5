"""The ``checkpoint`` section: the loader's own automatic checkpoints."""

from __future__ import annotations

import dataclasses

from fmsdata.config.values import non_negative_int, optional_path, set_field
from fmsdata.errors import ConfigError

__all__ = ["CheckpointConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where and how often the loader saves its state by itself, and how many it keeps.

    Attributes:
        checkpoint_dir: Folder of automatic loader checkpoints (``step_NNNNNNNNN/``), a
            local path or any fsspec URL (``s3://bucket/run/loader``, reached with the
            storage options of the remote section); when set, the loader resumes from the
            newest complete one it finds there.
        checkpoint_every: Save a loader checkpoint every this many batches (0 = never).
        checkpoint_keep: Automatic checkpoints kept (older ones are removed).
    """

    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    checkpoint_keep: int = 2

    def __post_init__(self) -> None:
        set_field(self, "checkpoint_dir", optional_path("checkpoint_dir", self.checkpoint_dir))
        for name in ("checkpoint_every", "checkpoint_keep"):
            set_field(self, name, non_negative_int(name, getattr(self, name)))
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ConfigError(
                f"checkpoint_every={self.checkpoint_every} needs checkpoint_dir, got None"
            )
