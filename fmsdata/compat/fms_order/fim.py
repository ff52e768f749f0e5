"""fms-fsdp ``mamba-fim``'s fill-in-the-middle step (``FIMDataset``), applied to each line
the preload buffer outputs.

Facts of mamba-fim, reproduced here:

- a line is cut at every EOS value into pieces; the first boundary is position 0, not -1,
  so the line's first token is always dropped; every piece, the last (unfinished) one
  included, is followed by EOS, and the result is cut to the line's length;
- a piece of at least 10 tokens (``min_len``, which ``get_data_loader`` leaves at its
  default) draws ``torch.rand([1])``; if that is below ``psm_rate + spm_rate`` it draws two
  cut points ``torch.randint(0, len, [2])`` (prefix up to the smaller, middle up to the
  larger) and becomes, when the draw is below ``psm_rate``, PSM
  ``PRE prefix SUF suffix MID middle``, else SPM ``PRE SUF suffix MID prefix middle``;
- a FIM token that is falsy (None, and also id 0) is left out;
- the generator is seeded with the *distributed* rank (not the DataLoader worker's), like
  the preload buffer's; a resume on the same world size restores it, a rescaled one keeps
  the fresh seed.

State key: ``g_state`` (uint8).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fmsdata.errors import ConfigError

__all__ = ["FimStep"]

MIN_LEN = 10  # FIMDataset's default min_len; mamba-fim's get_data_loader keeps it


class FimStep:
    """Turns some documents of a line into PSM/SPM form, drawing as mamba-fim draws."""

    def __init__(self, values: dict[str, Any], rank: int):
        """``values``: the ``train_config`` loader fields mamba-fim reads (``eos_token``,
        ``psm_rate``, ``spm_rate``, ``fim_pre``, ``fim_mid``, ``fim_suf``)."""
        psm_rate, spm_rate = values["psm_rate"], values["spm_rate"]
        if not psm_rate + spm_rate > 0 or psm_rate + spm_rate > 1:
            raise ConfigError(
                f"fim_training needs 0 < psm_rate + spm_rate <= 1, got psm_rate={psm_rate!r} "
                f"and spm_rate={spm_rate!r} (mamba-fim asserts the same)"
            )
        self.eos, self.psm, self.spm = values["eos_token"], psm_rate, spm_rate
        self.pre, self.mid, self.suf = (
            [t] if t else [] for t in (values["fim_pre"], values["fim_mid"], values["fim_suf"])
        )
        self.generator = torch.Generator().manual_seed(rank)

    def __call__(self, line: np.ndarray) -> np.ndarray:
        n = len(line)
        bounds = [0, *np.flatnonzero(line == self.eos).tolist(), n]
        rate = self.psm + self.spm
        parts: list = []
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            doc = line[a + 1 : b]
            if len(doc) >= MIN_LEN:
                thresh = torch.rand([1], generator=self.generator).item()
                if thresh < rate:
                    cuts = torch.randint(0, len(doc), [2], generator=self.generator).tolist()
                    lo, hi = min(cuts), max(cuts)
                    pre, mid, suf = doc[:lo], doc[lo:hi], doc[hi:]
                    if thresh < self.psm:
                        parts += [self.pre, pre, self.suf, suf, self.mid, mid]
                    else:
                        parts += [self.pre, self.suf, suf, self.mid, pre, mid]
                    parts.append([self.eos])
                    continue
            parts += [doc, [self.eos]]
        out = np.concatenate([np.asarray(p, dtype=line.dtype) for p in parts])
        return out[:n]

    def state(self) -> dict:
        return {"g_state": self.generator.get_state().numpy().copy()}

    def load(self, state: dict, whole: bool) -> None:
        if whole and state.get("g_state") is not None:
            self.generator.set_state(torch.tensor(np.asarray(state["g_state"], np.uint8)))
