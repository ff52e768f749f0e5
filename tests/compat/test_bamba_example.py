"""Done-when of the fms-fsdp drop-in: the Bamba-style script (fms-fsdp's loop, one import
changed) trains under torchrun on 2 ranks and a second stage continues its data exactly
on 1 rank with resuming_dataset."""

import json
import os

import pytest
from support import run_torchrun

from fmsdata.handlers import ArrowDocHandler
from fmsdata.indexing import index_root
from fmsdata.synthetic import write_corpus

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "fms_fsdp_bamba.py")
DATASETS = "lang=en/dataset=commoncrawl,lang=de/dataset=wikipedia"


def torchrun(ranks, cwd, **flags):
    args = [part for name, value in flags.items() for part in (f"--{name}", str(value))]
    return run_torchrun(EXAMPLE, ranks, args, cwd, timeout=300)


def global_steps(log, ranks):
    """Per step, the sorted row hashes of every rank."""
    steps = {}
    for rank in range(ranks):
        with open(f"{log}.rank{rank}") as handle:
            for row in map(json.loads, handle):
                steps.setdefault(row["step"], []).extend(row["rows"])
    return {step: sorted(rows) for step, rows in steps.items()}


@pytest.mark.slow  # two torchrun launches: ~20 s of CPU
def test_bamba_script_runs_on_two_ranks_and_its_data_continues_on_one(tmp_path):
    files = dict.fromkeys(DATASETS.split(","), 2)
    root = write_corpus(tmp_path / "data", files, docs_per_file=30, mean_length=40).root
    index_root(root, ArrowDocHandler())
    common = dict(
        data_path=root,
        datasets=DATASETS,
        weights="3,1",
        seq_length=32,
        logical_shards=4,
        checkpoint_interval=4,
        report_interval=5,
    )
    out = torchrun(
        2,
        tmp_path,
        **common,
        batch_size=2,
        num_steps=10,
        ckpt_save_path=tmp_path / "stage1",
        batch_log=tmp_path / "stage1.log",
    )
    assert "step 10: loss" in out
    stage1 = global_steps(tmp_path / "stage1.log", 2)
    assert sorted(stage1) == list(range(1, 11))
    # Model and loader checkpoints side by side; the model's folder holds only its own.
    assert sorted(os.listdir(tmp_path / "stage1" / "checkpoints")) == ["step_4_ckp", "step_8_ckp"]
    assert sorted(os.listdir(tmp_path / "stage1" / "fmsdata_loader")) == [
        "step_000000004",
        "step_000000008",
    ]

    out = torchrun(
        1,
        tmp_path,
        **common,
        batch_size=4,
        num_steps=2,
        resuming_dataset=True,
        ckpt_load_path=tmp_path / "stage1",
        ckpt_save_path=tmp_path / "stage2",
        batch_log=tmp_path / "stage2.log",
    )
    assert "from step 0" in out  # a new stage: the model's step count restarts too
    stage2 = global_steps(tmp_path / "stage2.log", 1)
    assert [stage2[1], stage2[2]] == [stage1[9], stage1[10]]
