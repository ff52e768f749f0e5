"""``TokenStage.trace`` does to a line's parts what ``apply`` does to its tokens: for
random lines whose documents hold delimiter ids anywhere (at a piece's edges too), the
parts a stage's trace leaves, read back, are the tokens its ``apply`` writes."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.stages import DocumentFilter, FillInMiddle, TokenStage
from fmsdata.stages.outputs import TokenLine
from fmsdata.stages.spans import SPAN_WIDTH
from fmsdata.stages.traced import Part, TracedLine, cut_parts, parts_length

BOS, EOS, BOL, EOL, PAD = 1, 2, 3, 4, 5
PRE, MID, SUF = 8, 9, 10


class Source(TokenStage):
    """Stands in for the chain below a stage (never read here)."""


def line_strategy():
    return st.fixed_dictionaries(
        {
            "pieces": st.lists(
                st.tuples(st.booleans(), st.integers(0, 9), st.booleans()), min_size=1, max_size=5
            ),
            "bol": st.booleans(),
            "eol": st.booleans(),
            "pad": st.integers(0, 6),
            "seed": st.integers(0, 2**16),
        }
    )


def make_line(spec):
    """A line of random documents (token values 0..11: delimiter ids are common) as parts
    and as tokens, with its spans; the documents by key."""
    rng = np.random.default_rng(spec["seed"])
    documents, pieces, spans = {}, [], []
    for k, (bos, size, eos) in enumerate(spec["pieces"]):
        tokens = rng.integers(0, 12, size + 4)
        documents[(0, 0, k)] = tokens
        start = int(rng.integers(0, 3))
        parts = (
            ([Part("bos", 1, token=BOS)] if bos else [])
            + ([Part("doc", size, dataset=0, file=0, doc=k, start=start)] if size else [])
            + ([Part("eos", 1, token=EOS)] if eos else [])
        )
        if not parts:
            parts = [Part("doc", 1, dataset=0, file=0, doc=k, start=start)]
        pieces.append(parts)
        length = parts_length(parts)
        spans.append([0, 0, k, 0, length, length, -1])
    if spec["bol"]:
        pieces[0].insert(0, Part("bol", 1, token=BOL))
    if spec["eol"]:
        pieces[-1].append(Part("eol", 1, token=EOL))
    tail = [Part("pad", spec["pad"], token=PAD)] if spec["pad"] else []

    def read(ds, file, doc, start, length):
        return documents[(ds, file, doc)][start : start + length]

    spans = np.array(spans, dtype=np.int64).reshape(-1, SPAN_WIDTH)
    ids = list(range(len(pieces)))
    line = TracedLine(pieces, ids, tail, spans, ahead=0, read=read)
    tokens = line.tokens(line.parts())
    token_line = TokenLine.of(spans, spec["bol"], spec["eol"])
    token_line.ids = np.array(ids, dtype=np.int64)
    return line, tokens, token_line


def check(stage, spec):
    line, tokens, token_line = make_line(spec)
    content = line.content
    stage.trace(line)
    new_content = stage.apply(tokens, content, token_line)
    assert line.content == new_content
    assert np.array_equal(line.tokens(line.parts()), tokens)
    assert [parts_length(p) for p in line.pieces] == token_line.pieces.tolist()
    assert line.ids == token_line.ids.tolist()


@settings(max_examples=200, deadline=None)
@given(
    spec=line_strategy(),
    rates=st.sampled_from([(0.5, 0.5), (1.0, 0.0), (0.0, 1.0), (0.3, 0.3)]),
    sentinels=st.sampled_from([(PRE, MID, SUF), (PRE, None, SUF), (None, None, None)]),
    min_length=st.integers(0, 4),
    lines=st.integers(0, 5),
)
def test_fim_trace_follows_apply(spec, rates, sentinels, min_length, lines):
    stage = FillInMiddle(Source(None), 77, *rates, *sentinels, min_length, (BOS, EOS, BOL, EOL))
    stage.lines = lines  # the draws of a line come from the stage's count of lines seen
    check(stage, spec)


@settings(max_examples=100, deadline=None)
@given(spec=line_strategy(), modulus=st.integers(2, 4))
def test_filter_trace_follows_apply(spec, modulus):
    def keep(tokens, document_id):
        return int(tokens.sum()) % modulus != 0

    check(DocumentFilter(Source(None), keep, pad=PAD), spec)


def test_cut_parts_splits_documents_at_their_tokens():
    parts = [Part("bos", 1, token=1), Part("doc", 5, dataset=0, file=2, doc=3, start=4)]
    assert cut_parts(parts, 2, 4) == [Part("doc", 2, dataset=0, file=2, doc=3, start=5)]
    assert cut_parts(parts, 0, 2) == [parts[0], Part("doc", 1, dataset=0, file=2, doc=3, start=4)]
