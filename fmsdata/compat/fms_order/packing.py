"""fms-fsdp's hard packing of chunks into lines (``BufferDataset`` with ``pack_hard``).

Chunks are taken while the carried buffer plus the newest chunk is shorter than the line;
BOL is put first unless the buffer already starts with it; the line is the first
``length`` tokens, the rest is carried; if EOL is set and the line does not end with it,
the last token moves back to the carry and EOL takes its place. With BOL/EOL unset this
is plain concatenation cut every ``length`` tokens.

State key: ``buffer`` (the carried tokens).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["Packer"]


class Packer:
    def __init__(
        self, source: Callable[[], np.ndarray], length: int, bol: int | None, eol: int | None
    ):
        self.source, self.length, self.bol, self.eol = source, length, bol, eol
        self.buffer = np.zeros(0, np.int64)

    def next_line(self) -> np.ndarray:
        length = self.length
        parts, size = [self.buffer], len(self.buffer)
        new = np.zeros(0, np.int64)
        while size + len(new) < length:
            parts.append(new)
            size += len(new)
            new = self.source()
        buffer = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if self.bol is not None and (len(buffer) == 0 or buffer[0] != self.bol):
            buffer = np.concatenate([[self.bol], buffer])
        if len(buffer) < length:
            buffer = np.concatenate([buffer, new])
            new = None
        out, rest = buffer[:length].copy(), buffer[length:]
        if self.eol is not None and out[-1] != self.eol:
            rest = np.concatenate([out[-1:], rest])
            out[-1] = self.eol
        self.buffer = rest if new is None else np.concatenate([rest, new])
        return out

    def state(self) -> dict:
        return {"buffer": self.buffer.copy()}

    def load(self, state: dict, whole: bool) -> None:
        self.buffer = np.asarray(state["buffer"], np.int64) if whole else np.zeros(0, np.int64)
