"""The ``steering`` section: changes to a run's data that the loader applies as it goes."""

from __future__ import annotations

import dataclasses
from typing import Any

from fmsdata.config.section import Section, checked
from fmsdata.config.values import flag, split_csv, to_number
from fmsdata.errors import ConfigError

__all__ = ["SteeringConfig"]


def _skips(field: str, value: Any) -> tuple[tuple[int, int], ...]:
    skips = []
    for item in value or ():
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ConfigError(f"{field} entries are [step, n], got {item!r}")
        at, n = (to_number(field, v, int) for v in item)
        if at < 0 or n < 1:
            raise ConfigError(f"{field} needs step >= 0 and n >= 1, got {list(item)!r}")
        skips.append((at, n))
    return tuple(skips)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SteeringConfig(Section):
    """Interventions in a run (docs/guide/steering.md): a mix or line length changed on
    resume, batches passed over. None shapes a line, so none is part of a state's
    fingerprint.

    Attributes:
        allow_mix_change: Accept a resumed state saved with other ``datasets`` / weights /
            schedule: each dataset continues from its own position, new ones start.
        allow_changes: Fingerprint fields or stage settings a resumed state may differ in
            (an intended config change), as ``FmsDataLoader.load_state_dict`` takes them,
            also where the loader loads a state itself (``checkpoint_dir``, the trainer
            integrations): e.g. ``[seq_length]`` to continue a run at another sequence
            length (docs/guide/resume.md).
        skip_steps: ``[[step, n], ...]``: when the run reaches ``step``, pass over the next
            ``n`` batches (applied once; the state records it).
    """

    allow_mix_change: bool = checked(False, flag)
    allow_changes: tuple[str, ...] = checked((), lambda field, value: split_csv(field, value) or ())
    skip_steps: tuple[tuple[int, int], ...] = checked((), _skips)
