"""``Tracer``: what global step N of a run trained on, from its config and a checkpoint.

Any step is told exactly, at span level, by replaying the logical shards' chains and the
deal of rows to them (``fmsdata.trace.walker``) from the run's start or from a checkpoint,
reading no token but what a token-level stage's decision looks at (``fmsdata.stages.traced``).

Steps after a checkpoint are told from it (its world size unless another is given, the
config's mix as a resume applies it, the config's ``skip_steps``). Steps up to it are told
from the start of the run as the checkpoint records it (its mix, world size and skips),
and that replay is checked: it must reach the checkpoint's state in every logical shard it
followed, or the trace says these steps cannot be told from this checkpoint, and how to
tell them. A run whose weights followed its loss (``mix_policy``) is replayed with the
weights it recorded, each change applied at its step (``fmsdata.trace.walker``); after the
checkpoint, only the steps before the policy's next possible update can be told
(``Tracer.known_until``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from fmsdata.config import LoaderConfig, as_config
from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.remote.storage import Storage
from fmsdata.stages.shard import StageFactory
from fmsdata.trace.document import trace_document
from fmsdata.trace.origin import Origin, checkpoint_start, run_start, saved_mix, start_before
from fmsdata.trace.rows import LineTracer, RowTrace
from fmsdata.trace.tokens import batch_of
from fmsdata.trace.walker import StepDeal, StepWalker, line_tracer
from fmsdata.util.digest import batch_digest

__all__ = ["StepTrace", "Tracer"]


@dataclasses.dataclass
class StepTrace:
    """What one global step delivered.

    Attributes:
        step: The step (``loader.steps`` after it).
        world_size: Ranks of the run at that step.
        rows: Every rank's rows, rank by rank, in row order.
        skipped: The skip ``(at, n)`` that passed over the step (its rows were consumed
            and not trained on), or None.
        origin: Where the trace replayed from.
        checked: How a step before the checkpoint was checked, or None.
        accesses: The datasets' files (names the rows' files).
        batches: Each rank's ``input_ids`` and ``labels`` when asked for.
    """

    step: int
    world_size: int
    rows: list[RowTrace]
    skipped: tuple[int, int] | None
    origin: str
    checked: str | None
    accesses: list[Any]
    batches: list[dict[str, np.ndarray]] | None = None

    @property
    def not_followed(self) -> list[str]:
        """Token stages the trace could not follow (their rows are told before them)."""
        return sorted({label for row in self.rows for label in row.not_followed})

    def to_plain(self) -> dict[str, Any]:
        """``{"step", "world_size", "rows": [{"rank", "row", "pieces": [...], ...}],
        ...}`` (``RowTrace.to_plain``): what ``fmsdata trace --json`` prints."""
        out: dict[str, Any] = {
            "step": self.step,
            "world_size": self.world_size,
            "skipped": self.skipped is not None,
            "rows": [row.to_plain(self.accesses) for row in self.rows],
            "from": self.origin,
            "exact": not self.not_followed,
        }
        if self.skipped is not None:
            out["skip"] = {"at": self.skipped[0], "steps": self.skipped[1]}
        if self.checked:
            out["checked"] = self.checked
        if self.not_followed:
            out["not_followed"] = self.not_followed
        return out


class Tracer:
    """Tells what a run delivered, step by step and document by document.

    Args:
        config: The run's loader config (a ``LoaderConfig``, dict or YAML path), as the
            run used it from the checkpoint on (its ``skip_steps`` apply after it).
        checkpoint: A loader checkpoint: a folder of ``loader_rank_*.fms`` files, a
            folder of automatic checkpoints (the newest complete one), or every rank's
            states as ``state_dict()``/``snapshot()`` gave them. None: the run's start.
        world_size: Ranks of the run after the checkpoint (default: the checkpoint's;
            without one, ``global_batch_size / batch_size``).
        stages: The run's stage factory, when it was not the default.
        storage: How to reach a checkpoint URL (default: the config's remote settings).
    """

    def __init__(
        self,
        config: LoaderConfig | Any,
        checkpoint: Any = None,
        world_size: int | None = None,
        stages: StageFactory | None = None,
        storage: Storage | None = None,
    ):
        self.config = as_config(config)
        self.stages = stages
        self.world_size = world_size
        self.states = _read_states(checkpoint, storage or Storage.from_config(self.config.remote))
        self._origins: dict[str, Origin] = {}
        self._checked: str | None = None

    # -- origins -----------------------------------------------------------------------

    @property
    def checkpoint_step(self) -> int | None:
        """The step the checkpoint was saved at (None: no checkpoint)."""
        return None if self.states is None else self.origin("after").steps

    def origin(self, which: str) -> Origin:
        """``"after"``: the checkpoint (or the run's start); ``"before"``: the start of the
        run that led to the checkpoint; ``"saved"``: the checkpoint under the mix it was
        saved with (what a replay from the start must reach)."""
        if which not in self._origins:
            config, states, stages = self.config, self.states, self.stages
            if states is None:
                if which != "after":
                    raise ValueError(f"no {which!r} origin without a checkpoint")
                made = run_start(config, self.world_size, stages)
            elif which == "after":
                made = checkpoint_start(config, states, self.world_size, stages)
            elif which == "before":
                made = start_before(config, states, stages)
            else:
                made = checkpoint_start(saved_mix(config, states), states, None, stages)
            self._origins[which] = made
        return self._origins[which]

    @property
    def known_until(self) -> int | None:
        """The last step after the checkpoint (or the run's start) that can be told: where
        the run's weights follow its training loss, steps after the policy's next
        update were drawn with weights chosen from losses the checkpoint does not record.
        None: every step (no ``mix_policy`` after the checkpoint)."""
        return self.origin("after").loader.mix_update_due

    def check_known(self, step: int) -> None:
        """Refuse a step drawn with weights the checkpoint cannot know.

        Raises:
            ConfigError: Naming the step, why and what to give instead.
        """
        known = self.known_until
        if known is None or step <= known:
            return
        origin = self.origin("after")
        policy = origin.config.mix_policy
        raise ConfigError(
            f"step {step} cannot be told from {origin.label}: the run's weights follow its "
            f"training loss (mix_policy {policy!r}) and its next update, after step {known} "
            f"at the latest, chose the weights of the steps after it from losses "
            f"{origin.label} does not record; give a later checkpoint (--checkpoint) saved "
            f"at step {step - 1} or later to trace step {step}"
        )

    def origin_of(self, step: int) -> Origin:
        """Where step ``step`` is told from."""
        if step < 1:
            raise ConfigError(f"steps count from 1 (the first batch), got {step}")
        return self.origin("before" if step <= (self.checkpoint_step or 0) else "after")

    # -- steps -------------------------------------------------------------------------

    def step(self, step: int, tokens: bool = False) -> StepTrace:
        """Every rank's rows of global step ``step`` (and with ``tokens``, each rank's
        ``input_ids`` and ``labels``, read from the data).

        Raises:
            StateMismatchError: A step before the checkpoint that the checkpoint cannot
                tell (see the module docstring).
        """
        return next(self.steps([step], tokens))

    def steps(self, steps: Iterable[int], tokens: bool = False) -> Iterator[StepTrace]:
        """``step`` for each of ``steps`` (ascending), walking the run once."""
        wanted = sorted(set(steps))
        if not wanted:
            return
        if wanted[0] < 1:
            raise ConfigError(f"steps count from 1 (the first batch), got {wanted[0]}")
        before = [s for s in wanted if s <= (self.checkpoint_step or 0)]
        after = wanted[len(before) :]
        if before:
            checked = self.checked_before()
            with StepWalker(self.origin("before")) as walker:
                for step in before:
                    trace = self._trace(walker, step, tokens)
                    trace.checked = checked
                    yield trace
        if after:
            self.check_known(after[-1])
            with StepWalker(self.origin("after")) as walker:
                for step in after:
                    yield self._trace(walker, step, tokens)

    def document(self, dataset: str, file: str | int, doc: int, until: int | None = None) -> Any:
        """Every step up to ``until`` at which a document was delivered
        (``fmsdata.trace.document.trace_document``: a ``DocumentTrace``)."""
        return trace_document(self, dataset, file, doc, until)

    def batch(self, step: int) -> list[dict[str, np.ndarray]]:
        """Each rank's ``input_ids`` and ``labels`` of global step ``step`` (read from the
        data), as the loader delivered them (``output_dtype``)."""
        trace = self.step(step, tokens=True)
        if trace.batches is None:
            at, n = trace.skipped or (0, 0)
            raise ConfigError(
                f"step {step} delivered no tokens: a skip of {n} step(s) at step {at} passed "
                "over it"
            )
        return trace.batches

    def _trace(self, walker: StepWalker, step: int, tokens: bool) -> StepTrace:
        deal = walker.walk_to(step)
        tracer = line_tracer(walker)
        rows = step_rows(walker, deal, tracer)
        origin = walker.origin
        accesses = list(tracer.accesses)
        trace = StepTrace(step, origin.world_size, rows, deal.skipped, origin.label, None, accesses)
        if tokens and deal.skipped is None:
            if trace.not_followed:
                raise ConfigError(
                    f"step {step}'s tokens cannot be told: the trace cannot follow the token "
                    f"stage(s) {', '.join(trace.not_followed)} (define their trace(); "
                    "fmsdata.stages.base.TokenStage.trace)"
                )
            ignore, dtype = origin.config.ignore_first_labels, origin.config.output_dtype
            trace.batches = [
                batch_of([row for row in rows if row.rank == rank], tracer, ignore, dtype)
                for rank in range(origin.world_size)
            ]
        return trace

    def digests(self, steps: Iterable[int]) -> Iterator[tuple[int, list[str] | None]]:
        """Each rank's batch digest (``fmsdata.util.digest``) of each of ``steps``, None
        for a step a skip passed over."""
        for trace in self.steps(steps, tokens=True):
            if trace.batches is None:
                yield trace.step, None
            else:
                yield trace.step, [batch_digest(b["input_ids"], b["labels"]) for b in trace.batches]

    # -- the check of a replay from the start ------------------------------------------

    def checked_before(self) -> str:
        """Check, once, that the run replayed from its start reaches the checkpoint in
        every logical shard (a walk at span level); say how steps before it are told.

        Raises:
            StateMismatchError: As ``check_reaches``.
        """
        if self._checked is None:
            origin = self.origin("before")
            with StepWalker(origin) as walker:
                self.check_reaches(walker)
            self._checked = (
                f"replayed from {origin.label} on {origin.world_size} rank(s); the replay "
                f"reaches the checkpoint's state (step {self.checkpoint_step}) in every "
                "logical shard"
            )
        return self._checked

    def check_reaches(self, walker: StepWalker) -> None:
        """Walk on to the checkpoint's step and compare the state of every shard followed
        with the checkpoint's (both at span level).

        Raises:
            StateMismatchError: Naming the first shard that differs, why that can be and
                how to trace those steps instead.
        """
        last = self.checkpoint_step
        assert last is not None
        walker.pass_through(last)
        with StepWalker(self.origin("saved"), follow=walker.follow) as saved:
            for shard in sorted(walker.follow):
                if not _same(walker.state_of(shard), saved.state_of(shard)):
                    raise StateMismatchError(_unreached(walker.origin, shard, last))


def step_rows(walker: StepWalker, deal: StepDeal, tracer: LineTracer) -> list[RowTrace]:
    """The rows of the step ``deal`` deals: each shard's next lines, in row order."""
    wanted = collections.Counter(s for shards in deal.shards if shards for s in shards)
    pulled = {s: (walker.next_line(s), walker.take(s, n)) for s, n in sorted(wanted.items())}
    used: collections.Counter[int] = collections.Counter()
    rows = []
    for rank, shards in enumerate(deal.shards):
        for row, shard in enumerate(shards or ()):
            first, block = pulled[shard]
            k = used[shard]
            used[shard] += 1
            rows.append(walker.told(tracer, block.line(k), rank, row, shard, first + k))
    return rows


def _unreached(origin: Origin, shard: int, step: int) -> str:
    mix = origin.config.weight_schedule or origin.config.weights or "equal weights"
    return (
        f"steps up to the checkpoint (step {step}) cannot be told from it: the run replayed "
        f"from its start with the checkpoint's mix (datasets {list(origin.dataset.mix_names)}, "
        f"{mix}), its skips and {origin.world_size} rank(s) does not reach the checkpoint's "
        f"state of logical shard {shard}. The mix, the data or the chain changed on an earlier "
        "resume (or the run used another world size that left the shards uneven): trace these "
        "steps from an earlier checkpoint taken after that change (--checkpoint), or from "
        "the config the run started with (no --checkpoint)"
    )


def _same(a: Any, b: Any) -> bool:
    """Equality of plain nested data with numpy arrays."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return bool(a == b)


def _read_states(checkpoint: Any, storage: Storage) -> list[Any] | None:
    """Every rank's state of a checkpoint given as a folder or as the states."""
    if checkpoint is None:
        return None
    if isinstance(checkpoint, (list, tuple)):
        return list(checkpoint)
    if isinstance(checkpoint, dict):
        return [checkpoint]
    from fmsdata.checkpoint import latest_checkpoint, read_checkpoint
    from fmsdata.remote.folder import Folder
    from fmsdata.state.checkpointsave import state_names

    path = str(checkpoint)
    if not state_names(Folder(path, storage).names()):
        latest = latest_checkpoint(path, storage=storage)
        if latest is None:
            raise StateMismatchError(f"{path}: no loader checkpoint (loader_rank_*.fms files)")
        path = latest
    return list(read_checkpoint(path, storage=storage))
