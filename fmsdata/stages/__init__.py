"""The stages of a logical shard's pipeline, and the protocol your own stages follow.

Each logical shard runs a chain of stages built by a *stage factory* (``fmsdata.stages.shard``);
the default one is ``shard.shuffle(shard.pack(shard.documents()))``: document walks per
dataset mixed by token share (``TokenShareMixer``, the document source), packed into lines
(``LinePacker``, or ``BestFitPacker`` with ``packing: best_fit``), shuffled
(``ShuffleBuffer``). Two kinds of stage extend it:

- **Span-level** (``SpanStage``): ``__next__`` returns the next line as an int64 span array
  ``[pieces, SPAN_WIDTH]`` (``fmsdata.stages.base``), read from ``self.source``, before
  any token is read. Filter, reorder, hold back or repeat lines here; keep the spans'
  columns as they are.
- **Token-level** (``TokenStage``): ``apply(tokens, content, line)`` changes one
  materialized line in place (int32, ``seq_length + 1`` tokens, ``content`` of them
  before padding) and returns the new content count; ``line`` (a ``TokenLine``) holds
  the line's spans and the length and document id of each document piece, which a stage
  moving tokens between documents updates. Called once per line in the order the shard
  emits them, so its state is exact per line. It goes on top of the span-level part.
  Built in: ``FillInMiddle`` (``fim_training``) and ``DocumentFilter``.

Below the lines, the packer reads a *document source* (``DocumentSource``):
``read_ahead()`` gives the next block of documents (``Documents``, never empty),
``commit(n)`` marks the first ``n`` read as used, ``rewind()`` drops what was read ahead.
``shard.documents()`` is ``shard.mix(shard.streams())``: a ``TokenShareMixer`` over one
``DocumentStream`` per dataset, each a stage under the mixer (state path
``.../sources/<dataset>``), so ``walk``, ``settings`` and the state tools see it. A
document *order* is one ``DocumentStream`` subclass: it says in which order each cycle
reads the shard's fragments and their documents (``walk_order``), and the stream does the
rest (sharding, epochs, small datasets, skipping, state and its checks). ``RandomWalk``
(the default) and ``StoredOrder`` (``document_order: sequential``) are two such;
``shard.documents(MyOrder)`` puts yours in the chain, and ``examples/custom_order.py``
shows one resumed and rescaled exactly.

Every stage has the same state protocol (``Stage``): ``own_state()`` returns its own
fields as plain data and ``load_own_state()`` takes them back; ``state_dict()`` nests the
state of each input under its constant key (``children()``, default ``{"source": ...}``),
and ``load_state_dict()`` reads it strictly (exactly those keys, else a
``StateMismatchError`` naming the path). ``settings()`` lists what the output depends on:
saved in the state's fingerprint, a changed setting refuses an old state, naming the
stage and the setting. ``role`` names what the loader's code looks for (``"mixer"``,
``"dataset"``, ``"packer"``, ``"shuffle"``), never the class; a stage whose own state
holds spans also writes the class methods ``held_spans``, ``carry_over`` (its spans'
datasets renumbered on a mix change) and ``relength`` (what becomes of its lines on a
``seq_length`` change: the shuffle buffer hands them on to the packer, which re-packs
them), which read only the saved state they are given.

A stage keeping every 4th line only, inserted between packer and shuffle buffer::

    from fmsdata import build_dataloader
    from fmsdata.stages import SpanStage

    class EveryFourth(SpanStage):
        def __init__(self, source):
            super().__init__(source)
            self.seen = 0                      # lines read from source

        def __next__(self):
            while True:
                line = next(self.source)
                self.seen += 1
                if self.seen % 4 == 0:
                    return line

        def own_state(self):
            return {"seen": self.seen}

        def load_own_state(self, state):
            self.seen = int(state["seen"])

    def my_stages(shard):                      # module level: workers get it pickled
        return shard.shuffle(EveryFourth(shard.pack(shard.documents())))

    loader = build_dataloader("config.yaml", stages=my_stages)

Saving, resuming (also on another world size), skipping and ``fmsdata state show`` work
unchanged: they find the stages by role. ``examples/custom_stage.py`` trains on such a
chain and checks resume and rescale; ``tests/stagecheck.py`` is the resume/rescale
checker every stage's tests run.
"""

from fmsdata.config import Decoration
from fmsdata.stages.base import DatasetRenumbering, SpanStage, Stage, TokenStage, layout, walk
from fmsdata.stages.bestfit import BestFitPacker
from fmsdata.stages.documents import (
    DocumentStream,
    RandomWalk,
    StoredOrder,
    WalkOrder,
)
from fmsdata.stages.filter import DocumentFilter, DocumentTransform
from fmsdata.stages.fim import FillInMiddle
from fmsdata.stages.mixing import DatasetStreams, TokenShareMixer
from fmsdata.stages.outputs import TokenLine
from fmsdata.stages.packing import LinePacker
from fmsdata.stages.shard import Shard, StageFactory, default_stages
from fmsdata.stages.shuffle import ShuffleBuffer
from fmsdata.stages.source import Documents, DocumentSource

__all__ = [
    "Shard",
    "StageFactory",
    "default_stages",
    "Stage",
    "SpanStage",
    "TokenStage",
    "DatasetRenumbering",
    "walk",
    "layout",
    "Decoration",
    "DocumentSource",
    "Documents",
    "DocumentStream",
    "RandomWalk",
    "StoredOrder",
    "WalkOrder",
    "DatasetStreams",
    "TokenShareMixer",
    "LinePacker",
    "BestFitPacker",
    "ShuffleBuffer",
    "TokenLine",
    "FillInMiddle",
    "DocumentTransform",
    "DocumentFilter",
]
