"""The ``fim`` section: fill-in-the-middle, with fms-fsdp's field names."""

from __future__ import annotations

import dataclasses

from fmsdata.config.values import flag, non_negative_int, optional_token, set_field, to_number
from fmsdata.errors import ConfigError

__all__ = ["FimConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class FimConfig:
    """Fill-in-the-middle on every line (``fmsdata.stages.fim``), as the stage takes it.

    Attributes:
        fim_training: Turn it on: each document piece of at least ``fim_min_length``
            tokens becomes PSM with probability ``psm_rate`` or SPM with ``spm_rate``.
        psm_rate, spm_rate: Probabilities (summing to at most 1) of the two FIM layouts.
        fim_pre, fim_mid, fim_suf: FIM sentinel token ids; None inserts no token there.
        fim_min_length: Document pieces shorter than this stay as they are.
    """

    fim_training: bool = False
    psm_rate: float = 0.0
    spm_rate: float = 0.0
    fim_pre: int | None = None
    fim_mid: int | None = None
    fim_suf: int | None = None
    fim_min_length: int = 2

    def __post_init__(self) -> None:
        for name in ("fim_pre", "fim_mid", "fim_suf"):
            set_field(self, name, optional_token(name, getattr(self, name)))
        for name in ("psm_rate", "spm_rate"):
            rate = to_number(name, getattr(self, name), float)
            if not 0.0 <= rate <= 1.0:
                raise ConfigError(f"{name} must be a probability in [0, 1], got {rate!r}")
            set_field(self, name, rate)
        if self.psm_rate + self.spm_rate > 1.0:
            raise ConfigError(
                f"psm_rate + spm_rate must be at most 1, got {self.psm_rate} + {self.spm_rate}"
            )
        set_field(self, "fim_min_length", non_negative_int("fim_min_length", self.fim_min_length))
        flag("fim_training", self.fim_training)
