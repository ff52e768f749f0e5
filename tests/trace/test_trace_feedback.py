"""A mix whose weights follow the training loss (``mix_policy``), traced: each recorded
weight change is applied at its step as the loader applied it, so steps before, between
and after the updates, a document's deliveries across them and each step's tokens are
told as delivered; steps drawn with weights the checkpoint cannot know are refused.

The runs report a synthetic loss (each token's dataset's constant, ``a`` the harder
one), so the weights move at every update; the trace is compared with the tokens the
loaders delivered (tokens encode their origin, ``tracecheck``)."""

import json

import numpy as np
import pytest
import yaml
from feedback_ranks import synthetic_loss
from support import base_config, corpus, roundtrip
from tracecheck import assert_step_delivered, deliveries

from fmsdata import ConfigError, build_dataloader
from fmsdata.checkpoint import save_loader_state
from fmsdata.cli.main import main
from fmsdata.loader import feedback
from fmsdata.state.format import mix_history_of
from fmsdata.trace import Tracer

EVERY = 3
SAVED_AT = 10  # after the updates of steps 3, 6 and 9, one step into the next interval
STEPS = 14
LOSSES = (8.0, 1.0)


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("corpus"), docs_per_file=60, mean_length=20)


def feedback_config(info, **extra):
    return base_config(
        info,
        weights=[1, 1],
        bos_token=None,  # every token then names its dataset (the synthetic loss's key)
        eos_token=None,
        mix_policy="odm",
        mix_update_every=EVERY,
        odm_smoothing=0.0,
        odm_exploration=0.05,
        **extra,
    )


def feedback_run(info, config, world_size, saved_at=SAVED_AT, folder=None):
    """Every rank's batches of a run reporting the synthetic loss (per step: every
    rank's), every rank's state after ``saved_at`` steps (also saved into ``folder`` when
    given), and the mix history.

    The ranks run in this process in lockstep; what ``torch.distributed`` would sum over
    them (``fmsdata.loader.feedback.all_ranks``) is summed here, rank by rank, from each
    rank's sums rebuilt from its tokens (which must be what the rank reports)."""
    ranges = [list(r) for r in info.ranges.values()]
    loaders = [build_dataloader(config, rank=r, world_size=world_size) for r in range(world_size)]
    iterators = [iter(loader) for loader in loaders]
    delivered, states = [], []
    with pytest.MonkeyPatch.context() as patch:
        for _ in range(STEPS):
            batches = [next(it) for it in iterators]
            losses = [synthetic_loss(b["input_ids"], ranges, LOSSES) for b in batches]
            sums = [rank_sums(b, loss, info) for b, loss in zip(batches, losses)]
            total = np.sum(sums, axis=0)
            for rank, (loader, batch, loss) in enumerate(zip(loaders, batches, losses)):
                patch.setattr(feedback, "all_ranks", summed(sums[rank], total))
                loader.record_loss(batch, loss)
            delivered.append(batches)
            if loaders[0].steps == saved_at:
                states = [roundtrip(loader.snapshot()) for loader in loaders]
                for loader in loaders if folder is not None else ():
                    save_loader_state(loader, folder)
    histories = [loader.mix_history for loader in loaders]
    assert all(h == histories[0] for h in histories), histories
    return delivered, states, histories[0]


def rank_sums(batch, loss, info):
    """A rank's per-dataset loss sums and token counts of one batch (what it reports)."""
    datasets = info.dataset_of(batch["input_ids"].numpy())
    mask = feedback.counted_tokens(batch, datasets.shape)
    return np.concatenate(feedback.attribute(datasets, loss.numpy(), mask, len(info.ranges)))


def summed(mine, total):
    def all_ranks(values):
        assert np.array_equal(values, mine), (values, mine)
        return total.copy()

    return all_ranks


@pytest.fixture(scope="module", params=[1, 2], ids=["1rank", "2ranks"])
def run(request, info):
    config = feedback_config(info)
    delivered, states, history = feedback_run(info, config, request.param)
    return config, delivered, states, history


def test_the_run_changed_its_weights(run):
    _, _, states, history = run
    assert [step for step, _ in history] == [0, 3, 6, 9, 12]
    assert mix_history_of(states) == history[:4]
    assert history[1][1][0] > history[0][1][0], "the harder dataset gains weight"
    assert len({tuple(w) for _, w in history}) == len(history), "each update moves the weights"


def test_steps_around_the_updates_are_told_as_delivered(info, run):
    config, delivered, states, _ = run
    tracer = Tracer(config, checkpoint=states)
    assert tracer.checkpoint_step == SAVED_AT
    assert tracer.known_until == SAVED_AT + EVERY - 1  # one step of the interval recorded
    told = list(tracer.steps(range(1, SAVED_AT + EVERY)))
    assert [t.step for t in told] == list(range(1, SAVED_AT + EVERY))
    for trace in told:
        plain = trace.to_plain()
        assert_step_delivered(plain, delivered[trace.step - 1], info)
        if trace.step <= SAVED_AT:
            assert "reaches the checkpoint's state" in plain["checked"]


def test_each_step_alone_and_its_tokens(info, run):
    config, delivered, states, _ = run
    tracer = Tracer(config, checkpoint=states)
    for step in (3, 4, 7, 9, 10, 11, 12):
        assert_step_delivered(tracer.step(step).to_plain(), delivered[step - 1], info)
        for rank, batch in enumerate(tracer.batch(step)):
            for field in ("input_ids", "labels"):
                got = np.asarray(batch[field], dtype=np.int64)
                assert np.array_equal(got, delivered[step - 1][rank][field].numpy()), (step, rank)


def test_documents_across_the_updates_are_found(info, run):
    config, delivered, states, _ = run
    tracer = Tracer(config, checkpoint=states)
    after_first_update = 0
    for path, doc in documents_in(delivered[EVERY:SAVED_AT], info)[:12]:
        expected = deliveries(delivered[:SAVED_AT], info, path, doc)
        result = tracer.document(path.split("/")[0], path, doc).to_plain()
        assert merged(result["seen"]) == merged(expected), (path, doc)
        after_first_update += any(e["step"] > EVERY for e in expected)
    assert after_first_update >= 6


def test_steps_past_what_the_checkpoint_knows_are_refused(info, run):
    config, _, states, _ = run
    tracer = Tracer(config, checkpoint=states)
    with pytest.raises(ConfigError, match=r"step 13 .*mix_policy 'odm'.*later checkpoint"):
        tracer.step(SAVED_AT + EVERY)
    with pytest.raises(ConfigError, match="later checkpoint"):
        tracer.document("a", 0, 0, until=SAVED_AT + EVERY)
    # From the run's start, only the first interval is known.
    fresh = Tracer(config, world_size=len(states))
    assert fresh.known_until == EVERY
    with pytest.raises(ConfigError, match=f"step {EVERY + 1} cannot be told"):
        fresh.step(EVERY + 1)


def test_without_the_policy_after_the_checkpoint_every_step_is_told(info, run):
    """A resume that drops the policy keeps the last weights: nothing to refuse."""
    config, _, states, history = run
    fixed = {**config, "mix_policy": None, "weights": history[3][1], "allow_mix_change": True}
    tracer = Tracer(fixed, checkpoint=states)
    assert tracer.known_until is None
    resumed = []
    for rank in range(len(states)):
        loader = build_dataloader(fixed, rank=rank, world_size=len(states))
        loader.load_state_dict(states)
        resumed.append([b for _, b in zip(range(6), loader)])
    for trace in tracer.steps(range(SAVED_AT + 1, SAVED_AT + 7)):
        batches = [r[trace.step - SAVED_AT - 1] for r in resumed]
        assert_step_delivered(trace.to_plain(), batches, info)


def test_a_checkpoint_taken_at_an_update(info):
    """Saved right after the update of step 9 (its chains already carried over): the
    replay from the start changes the weights there too before it compares."""
    config = feedback_config(info)
    delivered, states, _ = feedback_run(info, config, 2, saved_at=3 * EVERY)
    tracer = Tracer(config, checkpoint=states)
    assert tracer.known_until == 4 * EVERY
    for trace in tracer.steps(range(2 * EVERY, 4 * EVERY + 1)):
        assert_step_delivered(trace.to_plain(), delivered[trace.step - 1], info)


def test_the_command_line_with_workers(info, tmp_path, capsys):
    """``fmsdata trace --checkpoint`` over a run whose two ranks had two workers each:
    steps around the updates told as delivered, a step past the next update refused."""
    config = feedback_config(info, num_workers=2)
    delivered, _, _ = feedback_run(info, config, 2, folder=tmp_path / "ckpt")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = ["trace", "--config", str(path), "--checkpoint", str(tmp_path / "ckpt")]
    for step in (2, 5, 8, SAVED_AT, SAVED_AT + EVERY - 1):
        code = main([*argv, "--step", str(step), "--json"])
        out = capsys.readouterr().out
        assert code == 0
        assert_step_delivered(json.loads(out), delivered[step - 1], info)
    code = main([*argv, "--step", str(SAVED_AT + EVERY)])
    captured = capsys.readouterr()
    assert code != 0
    message = captured.err + captured.out
    assert f"after step {SAVED_AT + EVERY - 1}" in message and "later checkpoint" in message


def test_a_token_stage_across_the_updates(info):
    """Fill-in-the-middle (a token stage the trace follows) on one rank: each step's
    tokens across the updates as delivered."""
    fim = dict(fim_training=True, psm_rate=0.4, spm_rate=0.4, fim_pre=8, fim_mid=9, fim_suf=10)
    config = feedback_config(info, **fim)
    ranges = [list(r) for r in info.ranges.values()]
    loader = build_dataloader(config, rank=0, world_size=1)
    delivered, states = [], []
    for batch in loader:
        delivered.append(batch)
        loader.record_loss(batch, synthetic_loss(batch["input_ids"], ranges, LOSSES))
        if loader.steps == SAVED_AT:
            states = [roundtrip(loader.snapshot())]
        if loader.steps == STEPS:
            break
    tracer = Tracer(config, checkpoint=states)
    for step in range(1, SAVED_AT + EVERY):
        (told,) = tracer.batch(step)
        for field in ("input_ids", "labels"):
            got = np.asarray(told[field], dtype=np.int64)
            assert np.array_equal(got, delivered[step - 1][field].numpy()), (step, field)


def documents_in(steps, info):
    """Every (path, doc) whose tokens some of ``steps``' batches hold."""
    values = np.unique(
        np.concatenate([b["input_ids"].numpy().ravel() for batches in steps for b in batches])
    )
    found = set()
    for path, (firsts, lengths) in sorted(info.files.items()):
        firsts, lengths = np.asarray(firsts), np.asarray(lengths)
        docs = np.searchsorted(firsts, values, side="right") - 1
        ok = (docs >= 0) & (values < firsts[np.maximum(docs, 0)] + lengths[np.maximum(docs, 0)])
        found.update((path, int(d)) for d in np.unique(docs[ok]))
    return sorted(found)


def merged(seen):
    """Pieces of one row that follow each other in the row and in the document, as one."""
    out = []
    for entry in sorted(seen, key=lambda e: (e["step"], e["rank"], e["row"], e["at"])):
        last = out[-1] if out else None
        if (
            last is not None
            and (last["step"], last["rank"], last["row"])
            == (entry["step"], entry["rank"], entry["row"])
            and last["at"] + last["length"] == entry["at"]
            and last["start"] + last["length"] == entry["start"]
        ):
            last["length"] += entry["length"]
        else:
            out.append({k: entry[k] for k in ("step", "rank", "row", "start", "length", "at")})
    return out
