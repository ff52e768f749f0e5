"""Each trainer example's documented commands, as written, on what ``fmsdata tokenize``
writes: no token ids given (they come from the root's ``metadata.json``), a run that
checkpoints, then the documented resume on another number of processes, which continues
with exactly the global steps of an unbroken run. Marker ``trainers`` (``-m trainers``)."""

import pytest
from examplecommands import (
    documented_commands,
    filled,
    logged_hashes,
    option,
    run_documented,
    tokenize_root,
    unbroken_hashes,
)

from fmsdata.data.rootconfig import root_token_ids

pytestmark = pytest.mark.trainers

# example -> the package it needs
TRAINERS = {
    "torchtitan_train.py": "torchtitan",
    "olmo_core_train.py": "olmo_core",
    "lightning_train.py": "pytorch_lightning",
}
# The examples' defaults (their --global-batch-size, --seq-length, --logical-shards).
GLOBAL_BATCH, SEQ, SHARDS = 4, 32, 4


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    return tokenize_root(str(tmp_path_factory.mktemp("tokenized")))


@pytest.mark.parametrize("script", sorted(TRAINERS))
def test_documented_commands_run_and_resume_on_a_tokenize_root(script, tokenized, tmp_path):
    pytest.importorskip(TRAINERS[script])
    root, dataset = tokenized
    commands = [filled(c, root, dataset) for c in documented_commands(script)]
    assert len(commands) == 2, commands  # a run that checkpoints, and its resume
    first_steps, last_steps = (
        int(option(commands[0], "--steps")),
        int(option(commands[1], "--steps")),
    )
    logs = [str(tmp_path / "first.jsonl"), str(tmp_path / "resumed.jsonl")]
    outputs = [
        run_documented(c, str(tmp_path), ["--hash-log", log]) for c, log in zip(commands, logs)
    ]
    config = {
        "data_path": root,
        "seq_length": SEQ,
        "batch_size": GLOBAL_BATCH,
        "logical_shards": SHARDS,
        "shuffle_window": 4,
        "num_workers": 0,
        **root_token_ids(root),
    }
    unbroken = unbroken_hashes(config, last_steps)
    first, resumed = (logged_hashes(log) for log in logs)
    assert first == {s: unbroken[s] for s in range(1, first_steps + 1)}
    assert resumed == {s: unbroken[s] for s in range(first_steps + 1, last_steps + 1)}
    # An exact resume is not called unreliable (Lightning checks the loader is resumable).
    assert "not resumable" not in outputs[1]
