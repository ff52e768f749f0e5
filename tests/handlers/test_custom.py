"""A format added by subclassing FileHandler runs through the same pipeline."""

import os

import numpy as np
from support import BOS, EOS, assert_same_batches, base_config, corpus, take

from fmsdata import FileHandler, build_dataloader, register_handler
from fmsdata.handlers.arrow import ArrowDocHandler


class TextLinesHandler(FileHandler):
    """One document per line of whitespace-separated token ids (no flat token buffer)."""

    name = "text_lines"
    extensions = (".toks",)

    def open(self, path):
        with open(path) as handle:
            return [np.array(line.split(), dtype=np.int64) for line in handle]

    def num_docs(self, reader):
        return len(reader)

    def get(self, reader, index):
        return reader[index]


def test_custom_format_gives_the_same_batches_as_arrow(tmp_path):
    info = corpus(tmp_path / "arrow")
    handler = ArrowDocHandler()
    for rel in info.files:
        reader = handler.open(str(tmp_path / "arrow" / rel))
        target = tmp_path / "text" / rel.replace(".arrow", ".toks")
        os.makedirs(target.parent, exist_ok=True)
        with open(target, "w") as out:
            for i in range(handler.num_docs(reader)):
                doc = handler.get(reader, i).tolist()
                # Every third document carries its own EOS, which strip_tokens removes.
                if i % 3 == 0:
                    doc = doc + [EOS]
                out.write(" ".join(map(str, doc)) + "\n")
    register_handler(TextLinesHandler)
    config = base_config(info, strip_tokens=[EOS], bos_token=BOS, eos_token=EOS, num_workers=1)
    arrow = take(build_dataloader(config), 20)
    text = build_dataloader(
        {**config, "data_path": str(tmp_path / "text"), "file_type": "text_lines"}
    )
    assert_same_batches(arrow, take(text, 20))
