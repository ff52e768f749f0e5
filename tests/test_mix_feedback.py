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
from support import assert_same_batches, base_config, corpus, roundtrip, take

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


def test_the_same_losses_twice_give_the_same_run(two_ranks):
    first, again, _ = two_ranks
    assert first == again


def test_resumed_on_two_ranks_matches_the_unbroken_run(two_ranks):
    first, _, resumed = two_ranks
    for unbroken, after in zip(first, resumed):
        assert after["batches"] == unbroken["batches"][SAVE_AT:]
        assert after["history"] == unbroken["history"]


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
