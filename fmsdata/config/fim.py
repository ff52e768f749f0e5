"""The ``fim`` section: fill-in-the-middle, with fms-fsdp's field names."""

from __future__ import annotations

import dataclasses

from fmsdata.config.section import Section, checked
from fmsdata.config.values import flag, non_negative_int, number, optional_token
from fmsdata.errors import ConfigError

__all__ = ["FimConfig"]

_PROBABILITY = number(float, "a probability in [0, 1]", lambda p: 0 <= p <= 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FimConfig(Section):
    """Fill-in-the-middle on every line (``fmsdata.stages.fim``), as the stage takes it.

    Attributes:
        fim_training: Turn it on: each document piece of at least ``fim_min_length``
            tokens becomes PSM with probability ``psm_rate`` or SPM with ``spm_rate``.
        psm_rate, spm_rate: Probabilities (summing to at most 1) of the two FIM layouts.
        fim_pre, fim_mid, fim_suf: FIM sentinel token ids; None inserts no token there.
        fim_min_length: Document pieces shorter than this stay as they are.
    """

    fim_training: bool = checked(False, flag)
    psm_rate: float = checked(0.0, _PROBABILITY)
    spm_rate: float = checked(0.0, _PROBABILITY)
    fim_pre: int | None = checked(None, optional_token)
    fim_mid: int | None = checked(None, optional_token)
    fim_suf: int | None = checked(None, optional_token)
    fim_min_length: int = checked(2, non_negative_int)

    def _check(self) -> None:
        if self.psm_rate + self.spm_rate > 1.0:
            raise ConfigError(
                f"psm_rate + spm_rate must be at most 1, got {self.psm_rate} + {self.spm_rate}"
            )
