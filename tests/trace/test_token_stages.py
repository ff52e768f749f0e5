"""Token-level stages are told exactly where they say what they do to a line
(``TokenStage.trace``: fill-in-the-middle, document filters), and named where they do
not."""

import numpy as np
import pytest
from support import PAD, base_config, corpus
from tracecheck import assert_step_delivered, rank_batches

from fmsdata import ConfigError
from fmsdata.stages import DocumentFilter, DocumentTransform, FillInMiddle, TokenStage
from fmsdata.stages.shard import default_stages
from fmsdata.trace import Tracer

PRE, MID, SUF = 8, 9, 10
FIM = dict(fim_training=True, psm_rate=0.4, spm_rate=0.4, fim_pre=PRE, fim_mid=MID, fim_suf=SUF)


def by_id(tokens, document_id):
    return int(document_id) % 3 != 0


def by_tokens(tokens, document_id):
    return int(np.asarray(tokens, dtype=np.int64).sum()) % 4 != 1


def filter_by_id(shard):
    return DocumentFilter(default_stages(shard), by_id, pad=PAD)


def filter_by_tokens(shard):
    return DocumentFilter(default_stages(shard), by_tokens, pad=7)


def reverse(tokens, document_id):
    return tokens[::-1]


def transformed(shard):
    return DocumentTransform(default_stages(shard), reverse, pad=PAD)


class Reverse(TokenStage):
    """A stage that says nothing of what it does."""

    def apply(self, tokens, content, line):
        tokens[:content] = tokens[:content][::-1].copy()
        return content


def reversed_lines(shard):
    return Reverse(default_stages(shard))


class QuietFim(FillInMiddle):
    """A FIM that changes ``apply`` and keeps its parent's ``trace``: not followed."""

    def apply(self, tokens, content, line):
        return super().apply(tokens, content, line)


def quiet_fim(shard):
    fim = shard.fim(default_stages(shard).source)  # default_stages ends in FIM here
    return QuietFim(
        fim.source, fim.key, fim.psm_rate, fim.spm_rate, fim.pre, fim.mid, fim.suf,
        fim.min_length, fim.frame,
    )  # fmt: skip


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("corpus"))


def frame_in_documents(info):
    """BOS and EOS ids that some documents hold at their edges: FIM keeps delimiters found
    by value at a piece's edges, so the trace reads those tokens."""
    firsts, lengths = info.files["a/shard_00000.arrow"]
    return {"bos_token": int(firsts[0]), "eos_token": int(firsts[2] + lengths[2] - 1)}


@pytest.mark.parametrize(
    "name", ["fim", "fim pad", "fim psm only", "fim line delimiters", "fim frame in documents"]
)
def test_fill_in_the_middle_is_told(info, name):
    extra = {
        "fim": {},
        "fim pad": {"packing": "pad", "pad_token": PAD},
        "fim psm only": {"psm_rate": 1.0, "spm_rate": 0.0, "fim_mid": None},
        "fim line delimiters": {"bol_token": 3, "eol_token": 4},
        "fim frame in documents": frame_in_documents(info),
    }[name]
    config = base_config(info, **{**FIM, **extra})
    delivered = rank_batches(config, 2, 8)
    roles = set()
    for step, trace in enumerate(Tracer(config, world_size=2).steps(range(1, 9)), 1):
        told = trace.to_plain()
        assert_step_delivered(told, delivered[step - 1], info)
        roles |= {p.get("role") for row in told["rows"] for p in row["pieces"]}
    assert {"prefix", "middle", "suffix"} <= roles


@pytest.mark.parametrize("stages", [filter_by_id, filter_by_tokens])
@pytest.mark.parametrize("extra", [{}, {"packing": "pad", "pad_token": PAD}, FIM])
def test_document_filters_are_told(info, stages, extra):
    config = base_config(info, **extra)
    delivered = rank_batches(config, 2, 8, stages=stages)
    dropped = 0
    for step, trace in enumerate(Tracer(config, world_size=2, stages=stages).steps(range(1, 9)), 1):
        told = trace.to_plain()
        assert_step_delivered(told, delivered[step - 1], info)
        for row in told["rows"]:
            for gone in row.get("dropped", []):
                assert gone["by"] == "DocumentFilter"
                dropped += 1
    assert dropped, "the filter dropped pieces, and the trace says which"


@pytest.mark.parametrize(
    "stages, named",
    [
        (transformed, "fmsdata.stages.filter.DocumentTransform"),
        (reversed_lines, "test_token_stages.Reverse"),
        (quiet_fim, "test_token_stages.QuietFim"),
    ],
)
def test_a_stage_that_does_not_say_is_named(info, stages, named):
    config = base_config(info, **(FIM if stages is quiet_fim else {}))
    trace = Tracer(config, world_size=2, stages=stages).step(2)
    told = trace.to_plain()
    assert not told["exact"] and told["not_followed"] == [named]
    assert all(row["not_followed"] == [named] for row in told["rows"])
    with pytest.raises(ConfigError, match="cannot follow the token stage"):
        Tracer(config, world_size=2, stages=stages).batch(2)
