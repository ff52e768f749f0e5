"""The ``checkpoint`` section: the loader's own automatic checkpoints."""

from __future__ import annotations

import dataclasses

from fmsdata.config.section import Section, checked
from fmsdata.config.values import non_negative_int, optional_path
from fmsdata.errors import ConfigError

__all__ = ["CheckpointConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig(Section):
    """Where and how often the loader saves its state by itself, and how many it keeps.

    Attributes:
        checkpoint_dir: Folder of automatic loader checkpoints (``step_NNNNNNNNN/``), a
            local path or any fsspec URL (``s3://bucket/run/loader``, reached with the
            storage options of the remote section); when set, the loader resumes from the
            newest complete one it finds there.
        checkpoint_every: Save a loader checkpoint every this many batches (0 = never).
        checkpoint_keep: Automatic checkpoints kept (older ones are removed).
    """

    checkpoint_dir: str | None = checked(None, optional_path)
    checkpoint_every: int = checked(0, non_negative_int)
    checkpoint_keep: int = checked(2, non_negative_int)

    def _check(self) -> None:
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ConfigError(
                f"checkpoint_every={self.checkpoint_every} needs checkpoint_dir, got None"
            )
