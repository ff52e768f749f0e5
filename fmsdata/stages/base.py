"""What every pipeline stage shares: the ``Stage`` protocol, span-level and token-level
stages, the walk over a live chain and the record of it a state's fingerprint keeps. The
span layout lines are made of is ``fmsdata.stages.spans``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import IterableDataset

from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.stages.lineblock import LineBlock
from fmsdata.stages.spans import DS, SAVED_SPAN_WIDTH
from fmsdata.stages.traced import NotTraceable, TracedLine
from fmsdata.util.statecheck import need_keys, plain_problem, within

__all__ = [
    "Stage",
    "SpanStage",
    "TokenStage",
    "DatasetRenumbering",
    "LineChange",
    "walk",
    "layout",
    "traceable",
]


@dataclasses.dataclass(frozen=True)
class DatasetRenumbering:
    """A change of the dataset list met on resume (``allow_mix_change``).

    Attributes:
        mix: The datasets mixed from now on, in config order.
        number: For each dataset index of the saved spans, its index now (-1: gone).
        rebase: Measure every share afresh from here (the weights changed).
    """

    mix: tuple[str, ...]
    number: np.ndarray
    rebase: bool

    def spans(self, spans: np.ndarray, where: str) -> np.ndarray:
        """Saved spans (rows whose column 0 is a dataset index) in the new numbering."""
        spans = np.array(spans, dtype=np.int64).reshape(-1, SAVED_SPAN_WIDTH)
        if len(spans):
            spans[:, DS] = self.number[spans[:, DS]]
            if (spans[:, DS] < 0).any():
                raise StateMismatchError(
                    f"{where}: a buffered line refers to a dataset missing from the new numbering"
                )
        return spans


class LineChange:
    """A change of line length met on resume (``allow_changes=["seq_length"]``), as the
    stages of a saved chain are walked top first (``fmsdata.state.relength``).

    A stage that holds lines of the old length lets go of their spans (``give``): they are
    re-packed at the new length by the packer below it, which takes them (``take_pieces``)
    before its own held spans, in the order they would have come: the stages' held lines
    from the top down, each stage's in its own order.

    Attributes:
        documents: Finds the lengths of saved spans that run to their document's end
            (a ``fmsdata.stages.savedlines.DocumentLengths``).
        old_seq_length, seq_length: The line lengths saved with and resumed at (config
            ``seq_length``), for messages.
    """

    def __init__(self, documents: Any, old_seq_length: int, seq_length: int):
        self.documents = documents
        self.old_seq_length = old_seq_length
        self.seq_length = seq_length
        self.pieces: list[np.ndarray] = []

    def give(self, spans: np.ndarray) -> None:
        """Hand on held spans (runtime or saved columns, every length written out)."""
        if len(spans):
            self.pieces.append(np.asarray(spans, dtype=np.int64))

    def take_pieces(self) -> list[np.ndarray]:
        """The spans handed on so far, in order; they are the taker's from now on."""
        pieces, self.pieces = self.pieces, []
        return pieces


class Stage(IterableDataset):
    """One step of a logical shard's pipeline, with exact, nestable state.

    A stage reads its input(s) (``children()``, each under a constant key) and keeps a few
    fields of its own. Its state is those fields (``own_state``) plus each child's state
    under the child's key; ``load_state_dict`` reads it strictly (exactly those keys, the
    path inside the state named on a mismatch). ``state_dict()`` taken between two items
    describes exactly the items already handed out, so loading it into a fresh chain built
    the same way continues with the very next item.

    What a stage writes (the built-in stages and yours alike):

    - ``__next__`` (a ``SpanStage``) or ``apply`` (a ``TokenStage``): its work;
    - ``own_state`` / ``load_own_state``: its own fields as plain data, and back;
    - ``settings``: what its output depends on besides its input (a changed setting
      refuses an old state, naming the stage and the setting);
    - ``children``, only when it reads other than one ``source``.

    A stage whose own state holds spans (lines or pieces taken from its input and not
    handed out) also says so to the tools that read saved states without building a
    chain (``fmsdata state show``, a mix or ``seq_length`` change on resume, the checks of
    a loaded state): ``held_spans``, ``carry_over`` and ``relength``, class methods that
    read only the saved state they are given; ``report`` adds what ``state show`` prints.
    ``role`` names what the loader's code looks for (``"mixer"``, ``"dataset"``,
    ``"packer"``, ``"shuffle"``; None for anything else), never the class.
    """

    role: ClassVar[str | None] = None

    def __iter__(self) -> Stage:
        return self

    def __next__(self) -> Any:
        raise NotImplementedError

    # -- what a stage writes -------------------------------------------------------------

    def children(self) -> dict[str, Stage]:
        """The stages this one reads, by the constant key their state is saved under
        (default: ``{"source": self.source}`` when the stage has a ``source``)."""
        source = getattr(self, "source", None)
        return {"source": source} if isinstance(source, Stage) else {}

    def own_state(self) -> dict[str, Any]:
        """This stage's own fields (plain data: ints, strings, lists, numpy arrays)."""
        return {}

    def load_own_state(self, state: dict[str, Any]) -> None:
        """Take back what ``own_state`` gave (the keys are checked already)."""

    def settings(self) -> dict[str, Any]:
        """What this stage's output depends on besides its input (JSON-able values)."""
        return {}

    # -- what a saved state of it holds (class methods: no chain is built to ask) --------

    @classmethod
    def held_spans(cls, own: dict[str, Any]) -> np.ndarray:
        """The spans this stage's own saved state holds (``[n, SAVED_SPAN_WIDTH]``): lines
        or pieces it took from its input and has not handed out. A length of 0 stands for
        "to the end of the document" (how a shuffle buffer saves most spans)."""
        return np.zeros((0, SAVED_SPAN_WIDTH), dtype=np.int64)

    @classmethod
    def carry_over(
        cls, own: dict[str, Any], inputs: dict[str, Any], change: DatasetRenumbering
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """This stage's saved state after a change of the dataset list (``allow_mix_change``):
        its own part and its inputs' saved states by key, the inputs already carried over
        (default: as they are). A stage whose own state holds spans renumbers their
        datasets (``change.spans``); the mixer carries its counts over; a stage with one
        input per dataset keeps the kept datasets' inputs, starts new ones and drops
        removed ones (``DatasetStreams``)."""
        return own, inputs

    @classmethod
    def relength(
        cls, own: dict[str, Any], change: LineChange, settings: dict[str, Any]
    ) -> dict[str, Any]:
        """This stage's own saved state for lines of another length (a ``seq_length``
        change on resume, ``allow_changes=["seq_length"]``); ``settings`` are its settings
        in the chain resumed (the new capacity of a packer).

        Default: a stage that holds no spans keeps its state; one that holds spans must
        say what becomes of them (the shuffle buffer hands its lines on to be re-packed,
        ``change.give``; a packer takes them, ``change.take_pieces``), else the change is
        refused.

        Raises:
            StateMismatchError: This stage holds lines and does not say how to re-pack them.
        """
        if len(cls.held_spans(own)):
            raise StateMismatchError(
                f"{cls.__module__}.{cls.__qualname__} holds lines of seq_length="
                f"{change.old_seq_length} and does not say how to re-pack them "
                f"(Stage.relength): this run cannot continue at seq_length={change.seq_length}; "
                "start a new run, or give the stage a relength classmethod"
            )
        return own

    @classmethod
    def report(cls, own: dict[str, Any]) -> dict[str, Any]:
        """What this stage's own saved state holds and counts, for ``fmsdata state show``
        (``fmsdata.state.report``), which asks every stage of the chain and never reads a stage's
        keys itself.

        Returns plain data, any of: ``held`` (``[n, SAVED_SPAN_WIDTH]`` spans taken from the
        input and not handed out; default ``held_spans(own)``), ``held_tokens`` (tokens
        ``held`` stands for, per dataset index of the spans, when spans run to their
        document's end with length 0), ``held_as`` (how ``state show`` names them:
        ``"buffered"``, ``"unsent"``; default ``"held"``), ``counts`` (``{name: int}``,
        summed over logical shards and printed), ``ratios`` (``{name: [numerator,
        denominator]}``, two names of ``counts``: ``state show`` prints the sums' ratio,
        e.g. the best-fit packer's padding fraction), ``datasets`` (a document source's
        ``{name: {"taken_tokens", ...}}``) or ``dataset`` (one dataset's stream: the same
        fields for the dataset its ``settings()["dataset"]`` names: ``"taken_docs"``,
        ``"taken_tokens"``, ``"epoch"``, ``"pos"``, ``"size"``, ``"skipped"``).
        """
        return {"held": cls.held_spans(own)}

    # -- generic -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """How messages name this stage."""
        return self.role or type(self).__name__

    def state_dict(self, deferred: bool = False) -> dict[str, Any]:
        """Own fields plus each child's state under its key.

        Args:
            deferred: A stage of fmsdata's own may leave ``fmsdata.stages.deferred.Deferred``
                parts, made when the state is read (how a worker takes its shards' states
                every round); a stage of yours (a subclass of a built-in one too) always
                gives its ``own_state``, plain.

        Raises:
            ConfigError: A stage not of fmsdata's own gave an ``own_state`` that is not a
                dict of plain data (G6): it could not be saved, nor travel from a worker.
        """
        own = type(self).__module__.startswith("fmsdata.")
        state = self._own_state_deferred() if deferred and own else self.own_state()
        if not own:
            _check_own_state(self, state)
        for key, child in self.children().items():
            state[key] = child.state_dict(deferred)
        return state

    def _own_state_deferred(self) -> dict[str, Any]:
        """``own_state``, whose costly parts a built-in stage may leave ``Deferred``."""
        return self.own_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a ``state_dict()`` strictly: a StateMismatchError names the stage, and the
        keys leading to it inside the state."""
        children = self.children()
        own_keys = set(self.own_state())
        if own_keys & set(children):
            raise StateMismatchError(f"{self.name}: own state keys clash with its inputs' keys")
        need_keys(state, "", own_keys | set(children), f"{self.name} state")
        self.load_own_state({k: state[k] for k in own_keys})
        for key, child in children.items():
            with within(key):
                child.load_state_dict(state[key])


def _check_own_state(stage: Stage, state: Any) -> None:
    """Refuse a user stage's ``own_state`` that is not a dict of plain data."""
    cls = type(stage).__qualname__
    if not isinstance(state, dict):
        raise ConfigError(f"{cls}.own_state() must return a dict, got {type(state).__name__}")
    problem = plain_problem(state)
    if problem is not None:
        raise ConfigError(
            f"{cls}.own_state() must return plain data (ints, floats, strings, lists, dicts "
            f"with string keys, numpy arrays not of objects): {problem}"
        )


class SpanStage(Stage):
    """A span-level stage: yields lines as span arrays (see the module docstring), before
    any token is read. It reads lines from ``source`` (another ``SpanStage``) or, for the
    packer, documents from a document source.

    A line is an int64 array ``[pieces, SPAN_WIDTH]``; a stage may pass lines on, hold
    them back, drop them or reorder them, but keeps the spans' columns as they are.
    """

    def __init__(self, source: Stage):
        self.source = source

    def __next__(self) -> np.ndarray:
        raise NotImplementedError

    def take(self, n: int) -> list[np.ndarray]:
        """The next ``n`` lines: exactly what ``n`` calls of ``__next__`` give. Workers pull a
        shard's lines of a whole round at once; a stage may override this to do it faster."""
        return [next(self) for _ in range(n)]

    def take_lines(self, n: int) -> LineBlock:
        """The next ``n`` lines as one block (``fmsdata.stages.lineblock``): what ``take(n)``
        gives. The built-in shuffle buffer and packer hand lines on this way, one compiled
        pass instead of a numpy array per line (unless a subclass changes ``__next__`` or
        ``take``); a stage of yours needs only ``__next__``."""
        return LineBlock.of(self.take(n))

    def _changed_from(self, owner: type, *names: str) -> bool:
        """Whether this object's class changes any of ``owner``'s methods ``names``: a
        built-in stage's batched ``take`` / ``take_lines`` serve only when it does not (a
        subclass that changed ``__next__`` or ``take`` is taken at its word)."""
        cls = type(self)
        return any(getattr(cls, name) is not getattr(owner, name) for name in names)


class TokenStage(Stage):
    """A token-level stage: changes each materialized line of its shard, in order.

    ``apply(tokens, content, line)`` gets one line (int32 array of ``line_length`` tokens,
    ``content`` of them before the padding, and its ``TokenLine``: the spans it was
    packed from, the token count and document id of each document piece), changes the
    tokens in place, and returns the new content count. A stage that moves, adds or
    drops tokens sets ``line.pieces`` (summing to the new content) and ``line.ids`` anew:
    ``position_ids``, ``cu_seqlens`` and ``document_ids`` are built from them, after
    every token stage ran. It is called once per line, in the order its shard emits
    lines, so its state (``own_state``) is exact per line; a resume replays the lines
    after the last saved state through it.

    To drop a line, return 0 with ``line.pieces`` and ``line.ids`` emptied: the line keeps
    its row of the batch (every rank's batch keeps its shape, no other row moves) and
    trains nothing: its labels are all ``IGNORE_INDEX``, its document ids -1 and its
    position ids one padding run (``tests/stages/test_token_drop.py``). A row stands for
    exactly one line, which is what lets a skip or a rescale count lines without reading
    tokens; to leave lines out without a row, drop them at span level (a ``SpanStage``). Its
    ``source`` is the chain it follows (a ``SpanStage`` or another ``TokenStage``).

    ``trace(line)`` (optional) says what ``apply`` does to a line's parts rather than its
    tokens, so that ``fmsdata trace`` can say where every token of a row came from; a
    stage without it is named there, and rows are followed up to it only. Span-level
    stages need nothing of the kind: the trace runs them.
    """

    def __init__(self, source: Stage):
        self.source = source

    def apply(self, tokens: np.ndarray, content: int, line: Any) -> int:
        raise NotImplementedError

    def trace(self, line: TracedLine) -> None:
        """Do to ``line`` what ``apply`` does to a line's tokens, on its parts (a
        ``fmsdata.stages.traced.TracedLine``): the pieces it drops (``line.drop``), cuts,
        moves or adds to (``line.set_content``; a ``Part`` per run of inserted tokens).
        ``fmsdata trace`` asks it to say where each token of a delivered row came from,
        without reading the lines' tokens; so read only what the decision looks at
        (``line.tokens``, ``line.edges``), and do not change this stage's state: a stage
        keyed by its count of lines seen draws for this line with that count plus
        ``line.ahead``. ``FillInMiddle`` and ``DocumentFilter`` show both kinds.

        Not written (the default), the trace names this stage and follows rows only up to
        it; a subclass that changes ``apply`` must write its own.

        Raises:
            NotTraceable: This stage does not say what it does to a line.
        """
        raise NotTraceable(f"{type(self).__module__}.{type(self).__qualname__} has no trace()")


def traceable(stage: TokenStage) -> bool:
    """Whether ``stage.trace`` describes its ``apply``: written, by the class that wrote
    ``apply`` or a subclass of it (a subclass that changed ``apply`` but not ``trace``
    would be mis-traced, so it is not followed)."""
    cls = type(stage)
    trace_owner = next(c for c in cls.__mro__ if "trace" in vars(c))
    apply_owner = next(c for c in cls.__mro__ if "apply" in vars(c))
    return trace_owner is not TokenStage and issubclass(trace_owner, apply_owner)


def walk(top: Stage, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Stage]]:
    """Every stage of a chain with its path of keys in the chain's state, top first."""
    yield path, top
    for key, child in top.children().items():
        yield from walk(child, (*path, key))


def layout(top: Stage) -> list[dict[str, Any]]:
    """The chain as the state fingerprint records it: each stage's path in the chain's
    state, type (``module.qualname``), role and settings.

    Raises:
        ConfigError: A stage's ``settings()`` holds a value a state file cannot keep (said
            when the loader is built, not at the first checkpoint).
    """
    out = []
    for path, stage in walk(top):
        cls = type(stage)
        settings = stage.settings()
        _check_plain(settings, stage, "settings()")
        out.append(
            {
                "path": list(path),
                "stage": f"{cls.__module__}.{cls.__qualname__}",
                "role": stage.role,
                "settings": settings,
            }
        )
    return out


def _check_plain(value: Any, stage: Stage, where: str) -> None:
    """Refuse what JSON and the state file cannot hold (a numpy scalar, a set, an object)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, stage, f"{where}[{i}]")
        return
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        for key, item in value.items():
            _check_plain(item, stage, f"{where}[{key!r}]")
        return
    cls = type(stage)
    raise ConfigError(
        f"{cls.__module__}.{cls.__qualname__}: {where} is {type(value).__name__} {value!r}; "
        "settings are saved in every state's fingerprint: give plain values (bool, int, "
        "float, str, None, lists, dicts with str keys), e.g. bool(x) or int(x)"
    )
