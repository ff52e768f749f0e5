"""Every example's documented commands, as written, on what ``fmsdata tokenize`` writes (the
demo's corpus): no token ids given, they come from the root's ``metadata.json``. The trainer
examples (torchtitan, OLMo-core, Lightning) are run the same way by
``tests/integrations/test_trainer_examples_documented.py`` (``-m trainers``)."""

import os

import pytest
from examplecommands import (
    EXAMPLES,
    documented_commands,
    filled,
    logged_hashes,
    option,
    run_documented,
    tokenize_root,
    unbroken_hashes,
)

from fmsdata.data.rootconfig import root_token_ids

pytestmark = pytest.mark.slow  # torchrun launches and example runs in subprocesses

TRAINER_EXAMPLES = {"torchtitan_train.py", "olmo_core_train.py", "lightning_train.py"}


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    return tokenize_root(str(tmp_path_factory.mktemp("tokenized")))


def test_every_example_documents_a_runnable_command():
    scripts = sorted(n for n in os.listdir(EXAMPLES) if n.endswith(".py"))
    assert "train_fsdp.py" in scripts
    for script in scripts:
        assert documented_commands(script), f"{script}: no runnable command in its docstring"


def test_train_fsdp_documented_commands_train_and_resume_on_more_ranks(tokenized, tmp_path):
    root, dataset = tokenized
    commands = [filled(c, root, dataset) for c in documented_commands("train_fsdp.py")]
    assert len(commands) == 2, commands  # a run that checkpoints, and its resume
    logs = [str(tmp_path / "first.jsonl"), str(tmp_path / "resumed.jsonl")]
    outputs = [
        run_documented(c, str(tmp_path), ["--hash-log", log]) for c, log in zip(commands, logs)
    ]
    assert "bos_token 0, eos_token 1, vocab_size 4096" in outputs[0]
    first_steps, last_steps = (
        int(option(commands[0], "--steps")),
        int(option(commands[1], "--steps")),
    )
    config = {
        "data_path": root,
        "seq_length": 64,  # the example's defaults
        "batch_size": 8,
        "logical_shards": 8,
        "shuffle_window": 4,
        **root_token_ids(root),
    }
    unbroken = unbroken_hashes(config, last_steps)
    first, resumed = (logged_hashes(log, key="data_hash") for log in logs)
    assert first == {s: unbroken[s] for s in range(1, first_steps + 1)}
    assert resumed == {s: unbroken[s] for s in range(first_steps + 1, last_steps + 1)}


def test_fms_fsdp_bamba_documented_commands_run_and_restart(tokenized, tmp_path):
    root, dataset = tokenized
    commands = [filled(c, root, dataset) for c in documented_commands("fms_fsdp_bamba.py")]
    on_root = [c for c in commands if option(c, "--data_path") == root and "DATASET" not in c]
    on_root = [c for c in on_root if option(c, "--datasets") == dataset]
    assert len(on_root) == 2, commands  # a run, and the restarted job
    log = str(tmp_path / "batches")
    outputs = [run_documented(c, str(tmp_path), ["--batch_log", log]) for c in on_root]
    assert "Training for 20 steps from step 0" in outputs[0]
    assert "Training for 30 steps from step 20" in outputs[1]


@pytest.mark.parametrize(
    "script", ["custom_format.py", "custom_order.py", "custom_stage.py", "mixing_feedback.py"]
)
def test_custom_examples_documented_commands_pass_their_checks(script, tokenized, tmp_path):
    root, dataset = tokenized
    commands = [filled(c, root, dataset) for c in documented_commands(script)]
    for command in commands:  # each exits 1 when one of its checks fails
        output = run_documented(command, str(tmp_path), [])
        assert ": False" not in output
