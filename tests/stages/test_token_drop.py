"""The contract for a token stage that drops a line: ``apply`` returns 0 and empties
``line.pieces`` and ``line.ids``. The line keeps its place (its row of the batch, so every
rank's batch keeps its shape and no other row moves) but carries nothing to train on: its
inputs are padding, every label is ignored (``IGNORE_INDEX``), it holds no document piece
(its document ids are padding's -1, its position ids one padding run), and the stage's
state is exact per line, so resume and rescale continue exactly. Checked against the same
chain without the stage (the independent reference for every row that is not dropped)."""

import numpy as np
import pytest
from support import assert_same_batches, base_config, check_resume, corpus, scratch_dir, take

from fmsdata import build_dataloader
from fmsdata.stages import TokenStage
from fmsdata.stages.outputs import IGNORE_INDEX
from fmsdata.stages.shard import default_stages

PAD = 0


class DropEveryThird(TokenStage):
    """Drops every third line it sees (its state: lines seen)."""

    def __init__(self, source):
        super().__init__(source)
        self.seen = 0

    def apply(self, tokens, content, line):
        self.seen += 1
        if self.seen % 3:
            return content
        tokens[:] = PAD
        line.pieces = line.pieces[:0]
        line.ids = line.ids[:0]
        return 0

    def own_state(self):
        return {"seen": self.seen}

    def load_own_state(self, state):
        self.seen = int(state["seen"])


def dropping(shard):
    return DropEveryThird(default_stages(shard))


@pytest.mark.parametrize("workers", [0, 1])
def test_a_dropped_line_keeps_its_row_and_trains_nothing(workers):
    info = corpus(scratch_dir(), {"a": 3, "b": 2}, docs_per_file=20)
    config = base_config(
        info,
        num_workers=workers,
        pad_token=PAD,
        return_position_ids=True,
        return_document_ids=True,
        logical_shards=1,
    )
    plain = take(build_dataloader(config, rank=0, world_size=1), 6)
    dropped = take(build_dataloader(config, rank=0, world_size=1, stages=dropping), 6)
    rows = [(b, r) for b in range(6) for r in range(config["batch_size"])]
    for i, (b, r) in enumerate(rows):  # one logical shard: the stage sees rows in order
        got, ref = dropped[b], plain[b]
        if (i + 1) % 3:
            for key in ("input_ids", "labels", "position_ids", "document_ids"):
                assert np.array_equal(got[key][r], ref[key][r]), (key, b, r)
        else:
            assert (got["input_ids"][r] == PAD).all()
            assert (got["labels"][r] == IGNORE_INDEX).all(), "a dropped line trains nothing"
            assert (got["document_ids"][r] == -1).all(), "no document piece: padding's id"
            assert np.array_equal(got["position_ids"][r], np.arange(config["seq_length"]))


def test_a_chain_that_drops_lines_resumes_exactly():
    info = corpus(scratch_dir(), {"a": 3, "b": 2}, docs_per_file=20)
    config = base_config(info, num_workers=1, pad_token=PAD)
    check_resume(lambda: build_dataloader(config, rank=0, world_size=1, stages=dropping), 8, (2, 5))
    reference = take(build_dataloader(config, rank=0, world_size=1, stages=dropping), 8)
    again = take(build_dataloader(config, rank=0, world_size=1, stages=dropping), 8)
    assert_same_batches(reference, again)
