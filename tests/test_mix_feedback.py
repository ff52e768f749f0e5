"""A mix that follows the training loss (``mix_policy``, ``record_loss``, ``mix_history``).

Tokens encode their dataset (``support.corpus``), so each dataset's share of the tokens
delivered is counted from the batches, and a synthetic loss per token is its dataset's
constant: the weights the policy must give are then known from an independent reference
(``ODM_REFERENCE``, written one update at a time), whatever the loader attributes.
"""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from feedback_ranks import synthetic_loss
from support import base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.cli.main import main
from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.state.file import load_state, save_state
from fmsdata.state.format import mix_history_of

HERE = os.path.dirname(os.path.abspath(__file__))
LOSSES = (8.0, 1.0)  # dataset "a" is the harder one
EVERY = 4


def odm_reference(means, updates, k, smoothing, exploration):
    """ODM's weights after each of ``updates`` updates with the same mean losses, one
    dataset and one update at a time (Albalak et al. 2023, Algorithm 1, with a fixed
    exploration rate): what the loader's weights must be."""
    estimates = [0.0] * k
    weights = [1.0 / k] * k
    out = []
    for _ in range(updates):
        for d in range(k):
            estimates[d] = smoothing * estimates[d] + (1 - smoothing) * means[d] / weights[d]
        exps = [math.exp(exploration * estimates[d] - max(exploration * e for e in estimates))
                for d in range(k)]  # fmt: skip
        weights = [(1 - k * exploration) * e / sum(exps) + exploration for e in exps]
        out.append(weights)
    return out


def shares_of(batches, info):
    """Each dataset's share of the non-padding tokens of ``batches`` (input ids)."""
    which = info.dataset_of(np.asarray(batches))
    counts = np.bincount(which[which >= 0], minlength=len(info.ranges))
    return counts / counts.sum()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("feedback")
    info = corpus(root / "data", {"a": 3, "b": 3}, docs_per_file=120, mean_length=12)
    config = base_config(
        info,
        weights=[1, 1],
        seq_length=64,
        batch_size=4,
        logical_shards=4,
        shuffle_window=2,
        bos_token=None,  # every token then names its dataset, delimiters too
        eos_token=None,
        mix_policy="odm",
        mix_update_every=EVERY,
        odm_smoothing=0.0,
        odm_exploration=0.05,
    )
    ranges = [list(r) for r in info.ranges.values()]
    return info, config, ranges, root


def torchrun(folder, config, ranges, mode, ranks, steps, save_at):
    """``feedback_ranks.py`` on ``ranks`` gloo ranks (``torchrun --standalone``: a free
    rendezvous port); each rank's ``{"batches", "history"}``."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "setup.json")
    with open(path, "w") as handle:
        json.dump({"config": config, "losses": [ranges, list(LOSSES)]}, handle)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", str(ranks), os.path.join(HERE, "feedback_ranks.py")]
    command += [path, mode, str(folder), str(steps), str(save_at)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join([HERE, env.get("PYTHONPATH", "")])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    outs = []
    for r in range(ranks):
        with open(os.path.join(folder, f"out{r}.json")) as handle:
            outs.append(json.load(handle))
    return outs


STEPS, SAVE_AT = 40, 18  # the save falls inside an update interval (18 = 4 * 4 + 2)


@pytest.fixture(scope="module")
def two_ranks(setup):
    """The run on 2 ranks, twice from scratch, and resumed on 2 ranks from its save."""
    info, config, ranges, root = setup
    first = torchrun(root / "first", config, ranges, "run", 2, STEPS, SAVE_AT)
    again = torchrun(root / "again", config, ranges, "run", 2, STEPS, SAVE_AT)
    os.makedirs(root / "saved")
    for r in range(2):
        shutil.copy(root / "first" / f"rank{r}.state", root / "saved" / f"rank{r}.state")
    resumed = torchrun(root / "saved", config, ranges, "resume", 2, STEPS, SAVE_AT)
    return first, again, resumed


@pytest.mark.slow  # multi-process: in the slow tier (the default run stays under 5 min)
def test_two_ranks_shift_shares_the_way_odm_says(setup, two_ranks):
    info, config, _, _ = setup
    first, _, _ = two_ranks
    history = first[0]["history"]
    assert history == first[1]["history"]  # every rank applies the same weights
    assert [step for step, _ in history] == list(range(0, STEPS + 1, EVERY))
    expected = odm_reference(LOSSES, len(history) - 1, 2, 0.0, 0.05)
    np.testing.assert_allclose([w for _, w in history[1:]], expected, rtol=1e-12)
    assert history[-1][1][0] > 0.6  # the harder dataset gets more
    # The tokens delivered follow the weights applied, interval by interval.
    for (at, weights), (end, _) in zip(history, history[1:]):
        batches = [row for rank in first for b in rank["batches"][at:end] for row in b]
        assert abs(shares_of(batches, info)[0] - weights[0]) < 0.08, (at, weights)
    late = [row for rank in first for b in rank["batches"][STEPS // 2 :] for row in b]
    early = [row for rank in first for b in rank["batches"][:EVERY] for row in b]
    assert shares_of(late, info)[0] > shares_of(early, info)[0] + 0.1


@pytest.mark.slow  # multi-process: in the slow tier (the default run stays under 5 min)
def test_the_same_losses_twice_give_the_same_run(two_ranks):
    first, again, _ = two_ranks
    assert first == again


@pytest.mark.slow  # multi-process: in the slow tier (the default run stays under 5 min)
def test_resumed_on_two_ranks_matches_the_unbroken_run(two_ranks):
    first, _, resumed = two_ranks
    for unbroken, after in zip(first, resumed):
        assert after["batches"] == unbroken["batches"][SAVE_AT:]
        assert after["history"] == unbroken["history"]


@pytest.mark.slow  # multi-process: in the slow tier (the default run stays under 5 min)
def test_resumed_on_one_rank_continues_from_the_recorded_weights(setup, two_ranks):
    info, config, ranges, root = setup
    first, _, _ = two_ranks
    saved = [roundtrip_file(root / "saved" / f"rank{r}.state") for r in range(2)]
    recorded = mix_history_of(saved)
    assert [list(p) for p in recorded] == [p for p in first[0]["history"] if p[0] <= SAVE_AT]
    loader = build_dataloader({**config, "batch_size": 8}, rank=0, world_size=1)
    loader.load_state_dict(saved)
    assert loader.mix_history == recorded
    assert loader.config.weights == tuple(recorded[-1][1])
    batches = run(loader, STEPS - SAVE_AT, ranges)
    # The means are the same on any world size: so are the updates, at the same steps.
    np.testing.assert_allclose(
        [w for _, w in loader.mix_history], [w for _, w in first[0]["history"]], rtol=1e-12
    )
    assert [s for s, _ in loader.mix_history] == [s for s, _ in first[0]["history"]]
    upto = 20 - SAVE_AT  # the next update comes at step 20
    share = shares_of(torch.cat(batches[:upto]).tolist(), info)[0]
    assert abs(share - recorded[-1][1][0]) < 0.1


def run(loader, n, ranges, losses=LOSSES):
    """``n`` batches' input ids, each batch's synthetic loss reported as it comes."""
    batches = []
    for batch in loader:
        batches.append(batch["input_ids"].clone())
        loader.record_loss(batch, synthetic_loss(batch["input_ids"], ranges, losses))
        if len(batches) == n:
            break
    return batches


def roundtrip_file(path):
    return load_state(str(path))


# -- in one process ---------------------------------------------------------------------


def one_rank(config, **overrides):
    return build_dataloader({**config, **overrides}, rank=0, world_size=1)


def test_loss_is_attributed_by_the_tokens_datasets(setup):
    """Per token: each token's loss to its dataset; per sequence: each row's loss split
    by its datasets' shares of its tokens; ignored labels left out of both. The
    reference reads the dataset off each token's value."""
    info, config, _, _ = setup
    rng = np.random.default_rng(3)
    for per_token in (True, False):
        loader = one_rank(config, mix_update_every=1000, ignore_first_labels=3)
        batch = next(iter(loader))
        shape = batch["input_ids"].shape
        loss = rng.uniform(0.5, 4, shape if per_token else shape[:1])
        loader.record_loss(batch, torch.from_numpy(loss))
        record = loader.snapshot()["mix_feedback"]
        which = info.dataset_of(batch["input_ids"].numpy())
        counted = (which >= 0) & (batch["labels"].numpy() != -100)
        sums, tokens = np.zeros(2), np.zeros(2)
        for row in range(shape[0]):
            for d in range(2):
                mine = (which[row] == d) & counted[row]
                if per_token:
                    sums[d] += loss[row][mine].sum()
                    tokens[d] += mine.sum()
                else:
                    share = mine.sum() / counted[row].sum()
                    sums[d] += loss[row] * share
                    tokens[d] += share
        np.testing.assert_allclose(record["loss"], sums, rtol=1e-12)
        np.testing.assert_allclose(record["tokens"], tokens, rtol=1e-12)
        assert record["records"] == 1


@pytest.mark.parametrize("save_at", [0, 3, 4, 9])
def test_resume_in_process_and_with_workers_matches_the_unbroken_run(setup, save_at):
    """Saved before the first batch, inside an interval, right at an update: resumed
    with the same losses after it, the same batches and weights. A worker process gives
    what the main process does (it restarts at every update)."""
    _, config, ranges, _ = setup
    unbroken = one_rank(config)
    expected = run(unbroken, 14, ranges)
    for workers in (0, 1):
        first = one_rank(config, num_workers=workers)
        head = run(first, save_at, ranges) if save_at else []
        state = first.snapshot()
        resumed = one_rank(config, num_workers=workers)
        resumed.load_state_dict(state)
        tail = run(resumed, 14 - save_at, ranges)
        for a, b in zip(expected, head + tail):
            assert torch.equal(a, b)
        assert resumed.mix_history == unbroken.mix_history


def test_another_loss_gives_another_run_and_no_loss_keeps_the_weights(setup):
    _, config, ranges, _ = setup
    easy_a = one_rank(config)
    run(easy_a, 12, ranges, losses=(1.0, 8.0))
    hard_a = one_rank(config)
    run(hard_a, 12, ranges)
    assert easy_a.mix_history[-1][1][0] < 0.5 < hard_a.mix_history[-1][1][0]
    silent = one_rank(config)
    take(silent, 12)
    assert silent.mix_history == [(0, [0.5, 0.5])]


def test_doremi_and_a_user_policy_drive_the_mix(setup):
    info, config, ranges, _ = setup
    doremi = one_rank(
        config, mix_policy="doremi", doremi_reference_losses=[7.0, 0.5], odm_exploration=None
    )
    run(doremi, 8, ranges)
    # excess losses 1 and 0.5: a' = a * exp(eta * excess), smoothed towards uniform
    a = np.array([0.5, 0.5])
    for _ in range(2):
        a = a * np.exp([1.0, 0.5])
        a = (1 - 1e-3) * a / a.sum() + 1e-3 / 2
    np.testing.assert_allclose(doremi.mix_history[-1][1], a, rtol=1e-12)
    user = one_rank(
        config,
        mix_policy="test_mix_feedback:FavourTheHardest",
        mix_policy_options={"share": 0.8},
    )
    batches = run(user, 20, ranges)
    assert [s for s, _ in user.mix_history] == [0, 4, 8, 12, 16, 20]
    np.testing.assert_allclose([w for _, w in user.mix_history[1:]], [[0.8, 0.2]] * 5)
    # Lines in the shuffle buffers when the weights changed come first (3 batches here).
    assert abs(shares_of(torch.cat(batches[8:]).tolist(), info)[0] - 0.8) < 0.05
    assert user.snapshot()["mix_feedback"]["state"] == {"updates": 5}


class FavourTheHardest:
    """A user policy: ``share`` of the tokens to the dataset of the highest mean loss."""

    def __init__(self, datasets, weights, share):
        self.k, self.share, self.updates = len(datasets), share, 0

    def update(self, losses, tokens, weights):
        self.updates += 1
        out = [(1 - self.share) / (self.k - 1)] * self.k
        out[int(np.nanargmax(losses))] = self.share
        return out

    def state_dict(self):
        return {"updates": self.updates}

    def load_state_dict(self, state):
        self.updates = state["updates"]


def test_misuse_is_refused_by_name(setup):
    _, config, ranges, _ = setup
    plain = one_rank(config, mix_policy=None)
    batch = next(iter(plain))
    with pytest.raises(ConfigError, match="set mix_policy"):
        plain.record_loss(batch, torch.zeros(4))
    loader = one_rank(config)
    with pytest.raises(ConfigError, match="recorded already"):
        loader.record_loss(None, torch.zeros(4))
    batch = next(iter(loader))
    with pytest.raises(ConfigError, match=r"got shape \[4, 3\]"):
        loader.record_loss(batch, torch.zeros(4, 3))
    with pytest.raises(ConfigError, match="not finite"):
        loader.record_loss(batch, torch.full((4,), float("nan")))
    broken = one_rank(config, mix_policy="test_mix_feedback:FavourTheHardest")
    with pytest.raises(ConfigError, match="cannot be made"):
        next(iter(broken))
    missing = one_rank(config, mix_policy="no_such_module:Policy")
    with pytest.raises(ConfigError, match="'no_such_module:Policy' cannot be imported"):
        missing.steps  # noqa: B018


def test_a_changed_mix_needs_allow_mix_change_and_keeps_the_history(setup):
    _, config, ranges, _ = setup
    loader = one_rank(config)
    run(loader, 10, ranges)
    state = loader.snapshot()
    changed = one_rank(config, mix_update_every=2)
    with pytest.raises(StateMismatchError, match="mix_update_every"):
        changed.load_state_dict(state)
    assert changed.mix_history == [(0, [0.5, 0.5])]  # a refused state leaves it as it was
    allowed = one_rank(config, mix_update_every=2, allow_mix_change=True)
    allowed.load_state_dict(state)
    assert allowed.mix_history == [*loader.mix_history, (10, [0.5, 0.5])]
    run(allowed, 4, ranges)
    assert [s for s, _ in allowed.mix_history[-3:]] == [10, 12, 14]
    # A run without a policy resumed from one: a mix change, the history kept.
    fixed = one_rank(config, mix_policy=None, weights=[1, 3], allow_mix_change=True)
    fixed.load_state_dict(state)
    assert fixed.mix_history == [*loader.mix_history, (10, [0.25, 0.75])]
    with pytest.raises(StateMismatchError, match="mix_policy"):
        one_rank(config, mix_policy=None).load_state_dict(state)


def test_state_show_prints_and_plots_the_weights_as_applied(setup, tmp_path, capsys):
    _, config, ranges, _ = setup
    loader = one_rank(config)
    run(loader, 9, ranges)
    path = str(tmp_path / "run.state")
    save_state(path, loader.snapshot())
    assert main(["state", "show", path]) == 0
    out = capsys.readouterr().out
    assert "mix_policy 'odm'), 2 update(s)" in out
    for step, weights in loader.mix_history:
        assert f"from step {step:>8,}: " + "  ".join(f"{w:.4f}" for w in weights) in out
    assert main(["state", "show", path, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [tuple(p) for p in shown["mix_history"]] == loader.mix_history
    pytest.importorskip("matplotlib")
    assert main(["state", "show", path, "--plot", str(tmp_path / "run.png")]) == 0
    assert os.path.getsize(tmp_path / "run.png") > 0


def test_automatic_checkpoints_hold_the_steps_loss_and_resume_exactly(setup, tmp_path):
    _, config, ranges, _ = setup
    unbroken = one_rank(config)
    expected = run(unbroken, 14, ranges)
    auto = {**config, "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_every": 5}
    first = one_rank(auto)
    run(first, 11, ranges)
    first.close()  # the save in flight finishes
    resumed = one_rank(auto)  # resumes from the newest complete checkpoint: step 10
    assert resumed.steps == 10
    tail = run(resumed, 4, ranges)
    assert all(torch.equal(a, b) for a, b in zip(expected[10:], tail))
    assert resumed.mix_history == unbroken.mix_history
