"""A user's stage anywhere in the default chain keeps G1-G4, and the state code (resume,
rescale, skip, ``state show``, fingerprints) works without knowing it."""

import faulthandler
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stagecheck import check_stage_rescale, check_stage_resume
from support import (
    Ledger,
    assert_same_batches,
    base_config,
    check_exactly_once_per_epoch,
    corpus,
    roundtrip,
    scratch_dir,
    take,
)

from fmsdata import ConfigError, StateMismatchError, build_dataloader
from fmsdata.cli.main import main
from fmsdata.stages import SpanStage, TokenStage
from fmsdata.stages.shard import Shard, default_stages
from fmsdata.stages.spans import SAVED_SPAN_WIDTH, restore_spans
from fmsdata.state.file import save_state


class SwapPairs(SpanStage):
    """Hands lines out in swapped pairs (2nd, 1st, 4th, 3rd, ...): holds a line in between,
    so its own state holds spans."""

    def __init__(self, source):
        super().__init__(source)
        self.held = None

    def __next__(self):
        if self.held is not None:
            line, self.held = self.held, None
            return line
        self.held = next(self.source)
        return next(self.source)

    def own_state(self):
        held = [] if self.held is None else self.held[:, :SAVED_SPAN_WIDTH].tolist()
        return {"held": held}

    def load_own_state(self, state):
        held = np.asarray(state["held"], dtype=np.int64).reshape(-1, SAVED_SPAN_WIDTH)
        self.held = restore_spans(held) if len(held) else None

    @classmethod
    def held_spans(cls, own):
        return np.asarray(own["held"], dtype=np.int64).reshape(-1, SAVED_SPAN_WIDTH)

    @classmethod
    def carry_over(cls, own, inputs, change):
        return {"held": change.spans(cls.held_spans(own), "SwapPairs").tolist()}, inputs


class Rotate(TokenStage):
    """Rotates each line's content by (lines seen mod 5): exact per-line state."""

    def __init__(self, source):
        super().__init__(source)
        self.lines = 0

    def apply(self, tokens, content, line):
        tokens[:content] = np.roll(tokens[:content], self.lines % 5)
        self.lines += 1
        return content

    def own_state(self):
        return {"lines": self.lines}

    def load_own_state(self, state):
        self.lines = int(state["lines"])


def above_shuffle(shard: Shard):
    return SwapPairs(default_stages(shard))


def below_shuffle(shard: Shard):
    return shard.shuffle(SwapPairs(shard.pack(shard.documents())))


def token_level(shard: Shard):
    return Rotate(default_stages(shard))


def everywhere(shard: Shard):
    return Rotate(SwapPairs(shard.shuffle(SwapPairs(shard.pack(shard.documents())))))


POSITIONS = {
    "above_shuffle": above_shuffle,
    "below_shuffle": below_shuffle,
    "token_level": token_level,
    "everywhere": everywhere,
}


def loaders(config, world, stages):
    return [
        build_dataloader(
            {**config, "batch_size": 4 // world}, rank=r, world_size=world, stages=stages
        )
        for r in range(world)
    ]


def steps_of(per_rank):
    return [
        sorted(tuple(row) for batches in per_rank for row in batches[s]["input_ids"].tolist())
        for s in range(len(per_rank[0]))
    ]


@settings(max_examples=8, deadline=None)
@given(
    position=st.sampled_from(sorted(POSITIONS)),
    before=st.sampled_from([1, 2]),
    after=st.sampled_from([1, 2, 4]),
    workers=st.sampled_from([0, 1, 2]),
    save_at=st.integers(0, 14),
)
def test_a_user_stage_anywhere_keeps_g1_to_g4(position, before, after, workers, save_at):
    info = corpus(scratch_dir(), {"a": 2, "b": 2}, docs_per_file=12, mean_length=30)
    config = base_config(info, logical_shards=4, num_workers=workers)
    stages = POSITIONS[position]
    total = 16
    reference = steps_of([take(loader, total) for loader in loaders(config, before, stages)])

    first = loaders(config, before, stages)
    head = [take(loader, save_at) for loader in first]
    if save_at:
        assert steps_of(head) == reference[:save_at]  # G2 against world size 1 or 2
    states = [roundtrip(loader.snapshot()) for loader in first]
    resumed = loaders(config, after, stages)
    for loader in resumed:
        loader.load_state_dict(states)
    tail = [take(loader, total - save_at) for loader in resumed]
    assert steps_of(tail) == reference[save_at:]  # G1 (same world size) and G3

    # G4 by token counts (a rotation inside a line keeps them).
    ledger = Ledger(info, config)
    for batches in (*head, *tail):
        ledger.add_batches(batches)
    settled = [loader.snapshot(settle=True) for loader in resumed]
    for state in settled:
        ledger.add_state(state, every_stage=True)
    check_exactly_once_per_epoch(ledger, settled, 4)  # G4


def test_user_stage_resumes_and_rescales_through_the_checker(tmp_path):
    info = corpus(tmp_path, {"a": 4, "b": 4}, docs_per_file=20, mean_length=30)
    config = base_config(info, logical_shards=4)
    dataset = build_dataloader(config, stages=below_shuffle).dataset
    context = dataset.shard_context(4)
    try:

        def build(sid=0):
            return below_shuffle(Shard(sid, context.recipe, context.accesses))

        check_stage_resume(build, 60, (0, 1, 2, 17, 59))
        check_stage_rescale(build, 4, before=4, after=2, batch_size=1)
    finally:
        context.close()


def test_a_changed_stage_setting_refuses_the_state_naming_it(tmp_path):
    info = corpus(tmp_path)
    config = base_config(info)
    loader = build_dataloader(config)
    take(loader, 3)
    other = build_dataloader({**config, "shuffle_window": 3})
    with pytest.raises(
        StateMismatchError, match="'shuffle' \\(ShuffleBuffer at top\\) with window=6 .* window=3"
    ):
        other.load_state_dict(loader.state_dict())
    inserted = build_dataloader(config, stages=below_shuffle)
    with pytest.raises(StateMismatchError, match="another chain of stages.*SwapPairs"):
        inserted.load_state_dict(loader.state_dict())


def test_skip_and_state_show_with_a_user_stage(tmp_path, capsys):
    info = corpus(tmp_path)
    config = base_config(info, num_workers=1)
    reference = take(build_dataloader(config, stages=everywhere), 12)
    loader = build_dataloader(config, stages=everywhere)
    take(loader, 3)
    loader.skip(4)
    assert_same_batches(reference[7:12], take(loader, 5))
    save_state(str(tmp_path / "state.fms"), loader.snapshot())
    assert main(["state", "show", str(tmp_path / "state.fms")]) == 0
    assert "saved by 1 rank(s) at step 12" in capsys.readouterr().out


def test_mix_change_renumbers_what_a_user_stage_holds(tmp_path):
    """Adding a dataset then dropping one renumbers the spans SwapPairs holds (its own
    ``renumber``), and every token is still accounted for (G4)."""
    info = corpus(tmp_path, {"a": 2, "b": 2, "c": 2}, docs_per_file=40, mean_length=20)
    config = base_config(info, datasets=["b", "c"], weights=[1, 1], shuffle_window=2)
    ledger = Ledger(info, {**config, "datasets": ["a", "b", "c"]})
    loader = build_dataloader(config, stages=everywhere)
    ledger.add_batches(take(loader, 15))
    state = roundtrip(loader.snapshot())
    # "a" comes first now: every saved dataset index moves by one.
    wider = {**config, "datasets": ["a", "b", "c"], "weights": [2, 1, 1]}
    resumed = build_dataloader({**wider, "allow_mix_change": True}, stages=everywhere)
    resumed.load_state_dict(state)
    ledger.add_batches(take(resumed, 30))
    settled = resumed.snapshot(settle=True)
    ledger.add_state(settled, every_stage=True)
    check_exactly_once_per_epoch(ledger, [settled], 4)


class KeepsState(SpanStage):
    """Passes lines on; its own state is whatever it was given (G6 refuses what is not
    plain data)."""

    state: object = None

    def __next__(self):
        return next(self.source)

    def own_state(self):
        return KeepsState.state

    def load_own_state(self, state):
        pass


NOT_PLAIN = [
    ({"lock": threading.Lock()}, r"lock: lock <unlocked"),
    ({"held": [1, {"seen": {3}}]}, r"held\[1\]\.seen: set \{3\}"),
    ({7: 1}, r"state: key 7 is not a string"),
    ({"ids": np.array(["a"], dtype=object)}, r"ids: a numpy array of dtype object"),
    ([1, 2], r"return a dict, got list"),
]


@pytest.mark.parametrize(
    ("state", "said", "num_workers"),
    [(state, said, 0) for state, said in NOT_PLAIN] + [(*NOT_PLAIN[0], 2), (*NOT_PLAIN[3], 2)],
)
def test_a_stage_state_that_is_not_plain_data_is_refused_by_name(
    monkeypatch, state, said, num_workers
):
    """A user stage's state that could not be saved, nor travel from a worker (where it
    used to be dropped by the worker's queue, and the main process waited forever), stops
    the loader with a ConfigError naming the stage and where in its state."""
    monkeypatch.setattr(KeepsState, "state", state)
    info = corpus(scratch_dir())
    loader = build_dataloader(
        {**base_config(info), "num_workers": num_workers},
        stages=lambda shard: KeepsState(shard.shuffle(shard.pack(shard.documents()))),
    )
    faulthandler.dump_traceback_later(120, exit=True)  # a hang fails the run, loudly
    try:
        with pytest.raises(ConfigError, match=r"KeepsState\.own_state\(\) must .*" + said):
            take(loader, 3)
            loader.snapshot()
    finally:
        faulthandler.cancel_dump_traceback_later()
