"""fms-fsdp's hard packing of chunks into lines (``BufferDataset`` with ``pack_hard``).

Chunks are taken while the carried buffer plus the newest chunk is shorter than the line;
BOL is put first unless the buffer already starts with it; the line is the first
``length`` tokens, the rest is carried; if EOL is set and the line does not end with it,
the last token moves back to the carry and EOL takes its place. With BOL/EOL unset this
is plain concatenation cut every ``length`` tokens.

Lines and the carry are span lists (``spans``): nothing is copied here.

State key: ``buffer`` (the carried segments, a list of ``spans.Segment``).
"""

from __future__ import annotations

from collections.abc import Callable

from .docstream import Chunk
from .spans import LIT, Segment, Tokens

__all__ = ["Packer"]


class Packer:
    def __init__(
        self,
        source: Callable[[], Chunk],
        tokens: Tokens,
        length: int,
        bol: int | None,
        eol: int | None,
    ):
        self.source, self.tokens, self.length, self.bol, self.eol = source, tokens, length, bol, eol
        self.buffer: list[Segment] = []
        self.size = 0

    def next_line(self) -> list[Segment]:
        length = self.length
        buffer, size = list(self.buffer), self.size
        new: list[Segment] = []
        new_size = 0
        while size + new_size < length:
            buffer += new
            size += new_size
            new, new_size, _ = self.source()
        if self.bol is not None and (size == 0 or buffer[0][4] != self.bol):
            buffer.insert(0, (LIT, 0, 0, 1, self.bol))
            size += 1
        if size < length:
            buffer += new
            size += new_size
            new, new_size = [], 0
        out, rest = self.tokens.split(buffer, length)
        rest_size = size - length
        if self.eol is not None and self.tokens.last(out) != self.eol:
            rest.insert(0, self.tokens.pop_last(out))
            out.append((LIT, 0, 0, 1, self.eol))
            rest_size += 1
        if new:
            rest += new
            rest_size += new_size
        self.buffer, self.size = rest, rest_size
        return out

    def state(self) -> dict:
        return {"buffer": self.tokens.encode([self.buffer])}

    def load(self, state: dict, whole: bool, where: str = "packer") -> None:
        self.buffer = []
        if whole:
            saved = state["buffer"]
            if not isinstance(saved, dict):  # fms-fsdp's carry: one run of tokens
                saved = [saved] if len(saved) else []
            lines = self.tokens.lines(saved, f"{where}.buffer")
            self.buffer = lines[0] if lines else []
        self.size = sum(seg[3] for seg in self.buffer)
