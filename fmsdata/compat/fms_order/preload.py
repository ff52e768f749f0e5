"""fms-fsdp's 10,000-line shuffle buffer (``PreloadBufferDataset``).

While it holds fewer than ``window`` lines it takes one more line before each output, so
it fills at two lines per output; each output is line ``i`` drawn by
``torch.randint(size, (1,))`` from a ``torch.Generator`` seeded with the *distributed*
rank (not the DataLoader worker's), and slot ``i`` gets the next line (or, in a buffer
larger than the window after a rescale, the last line, shrinking it by one).

Lines are span lists (``spans``), materialised only when output.

State keys: ``g_state`` (uint8), ``buffer`` (the lines in slot order, as
``Tokens.encode`` writes them; fms-fsdp's token lines are read too).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .spans import Segment, Tokens

__all__ = ["PreloadBuffer"]


class PreloadBuffer:
    def __init__(self, source: Callable[[], list[Segment]], tokens: Tokens, window: int, rank: int):
        self.source, self.tokens, self.window = source, tokens, window
        self.generator = torch.Generator().manual_seed(rank)
        self.buffer: list[list[Segment]] = []

    def next_line(self) -> list[Segment]:
        buf = self.buffer
        if len(buf) < self.window:
            buf.append(self.source())
        i = int(torch.randint(len(buf), (1,), generator=self.generator).item())
        out = buf[i]
        if len(buf) > self.window:
            buf[i] = buf[-1]
            buf.pop()
        else:
            buf[i] = self.source()
        return out

    def state(self) -> dict:
        return {
            "g_state": self.generator.get_state().numpy().copy(),
            "buffer": self.tokens.encode(self.buffer),
        }

    def load(self, state: dict, whole: bool, where: str = "preload") -> None:
        if whole and state.get("g_state") is not None:
            self.generator.set_state(torch.tensor(np.asarray(state["g_state"], np.uint8)))
        self.buffer = self.tokens.lines(state["buffer"], f"{where}.buffer")
