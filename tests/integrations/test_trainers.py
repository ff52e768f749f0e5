"""Each trainer's example under torchrun with gloo: a 2-process run checkpointed by the
trainer's own checkpointer, resumed on 2 and on 1 process, takes exactly the global steps of
an unbroken run (each global step's sequences compared by hash).

The unbroken run is fmsdata's own loader on one rank with the same global batch: by G2 a
global step's sequences do not depend on the number of ranks, and the 2-process run's first
steps are checked against it too. Deselected by default (``-m trainers`` runs them; they
need the ``test-trainers`` extra, see docs/guide/trainers.md)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from support import take

from fmsdata import build_dataloader
from fmsdata.data.synthetic import write_corpus

pytestmark = pytest.mark.trainers

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
# example script, its checkpoint-folder option
TRAINERS = {
    "torchtitan": ("torchtitan_train.py", "--dump"),
    "olmo_core": ("olmo_core_train.py", "--save"),
    "lightning": ("lightning_train.py", "--ckpt-dir"),
}
GLOBAL_BATCH, SEQ, SHARDS, STEPS, SAVED_AT = 4, 32, 4, 6, 3
# Where each trainer's checkpoint keeps the loader state, as ``fmsdata state show`` names it.
SOURCES = {
    "torchtitan": "torch.distributed.checkpoint, entry 'dataloader'",
    "olmo_core": "OLMo-core trainer state, entry 'data_loader'",
    "lightning": "Lightning checkpoint, entry 'FmsDataModule'",
}


def step_hash(input_ids):
    """The examples' order-independent hash of one global step's sequences."""
    rows = sorted(
        hashlib.blake2b(row.numpy().tobytes(), digest_size=8).hexdigest() for row in input_ids
    )
    return hashlib.blake2b("".join(rows).encode(), digest_size=12).hexdigest()


def hashes(path):
    with open(path) as handle:
        rows = [json.loads(line) for line in handle]
    steps = [row["step"] for row in rows]
    assert len(steps) == len(set(steps)), f"{path}: a step logged twice: {steps}"
    return {row["step"]: row["hash"] for row in rows}, {row["world_size"] for row in rows}


def run_torchrun(script, ranks, args, cwd, timeout):
    """``torchrun --standalone``: a free rendezvous port, so runs beside other torchrun
    jobs on the machine do not meet on the default one."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", str(ranks), script, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainers") / "data"
    write_corpus(root, {"a": 2, "b": 2}, docs_per_file=20, mean_length=40)
    loader = build_dataloader(
        {
            "data_path": str(root),
            "seq_length": SEQ,
            "batch_size": GLOBAL_BATCH,
            "logical_shards": SHARDS,
            "shuffle_window": 4,
            "num_workers": 0,
            "bos_token": 1,
            "eos_token": 2,
        },
        rank=0,
        world_size=1,
    )
    unbroken = {step: step_hash(b["input_ids"]) for step, b in enumerate(take(loader, STEPS), 1)}
    assert len(set(unbroken.values())) == STEPS  # distinct steps: a skip or repeat shows
    return str(root), unbroken


def check_state_show(trainer, folder):
    """``fmsdata state show`` on the folder the trainer wrote finds its newest checkpoint
    and reads every data-parallel rank's state from it (every logical shard), without
    running it."""
    done = subprocess.run(
        [sys.executable, "-m", "fmsdata.cli.main", "state", "show", str(folder), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["source"] == SOURCES[trainer]
    assert (summary["steps"], summary["world_size"]) == (SAVED_AT, 2)
    assert summary["lines"] == SAVED_AT * GLOBAL_BATCH
    assert [shard["id"] for shard in summary["shards"]] == list(range(SHARDS))
    assert str(SAVED_AT) in os.path.relpath(summary["path"], folder)


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_checkpoint_resume_and_rescale_through_the_trainer(trainer, data, tmp_path):
    pytest.importorskip(trainer if trainer != "lightning" else "pytorch_lightning")
    root, unbroken = data
    script, folder_option = TRAINERS[trainer]
    script = os.path.join(EXAMPLES, script)
    common = ["--data", root, "--global-batch-size", str(GLOBAL_BATCH), "--seq-length", str(SEQ)]
    common += ["--logical-shards", str(SHARDS), "--ckpt-every", str(SAVED_AT)]
    # A generated root has no metadata.json: the ids (and a vocabulary over its token
    # values) are given, as for fms-fsdp / Bamba data.
    common += ["--bos-token", "1", "--eos-token", "2", "--vocab-size", "8192"]

    def launch(ranks, folder, steps, log):
        args = [*common, folder_option, str(tmp_path / folder), "--steps", str(steps)]
        run_torchrun(script, ranks, [*args, "--hash-log", str(tmp_path / log)], str(tmp_path), 600)
        return hashes(tmp_path / log)

    first, sizes = launch(2, "two", SAVED_AT, "first.jsonl")
    assert sizes == {2}
    assert first == {s: unbroken[s] for s in range(1, SAVED_AT + 1)}
    check_state_show(trainer, tmp_path / "two")
    shutil.copytree(tmp_path / "two", tmp_path / "one")

    on_two, sizes = launch(2, "two", STEPS, "on_two.jsonl")
    assert sizes == {2}
    assert on_two == {s: unbroken[s] for s in range(SAVED_AT + 1, STEPS + 1)}

    on_one, sizes = launch(1, "one", STEPS, "on_one.jsonl")
    assert sizes == {1}
    assert on_one == {s: unbroken[s] for s in range(SAVED_AT + 1, STEPS + 1)}
