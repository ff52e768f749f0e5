"""Done-when of the fms-fsdp drop-in: the Bamba-style script (fms-fsdp's loop, one import
changed) trains under torchrun on 2 ranks and a second stage continues its data on 1 rank
with resuming_dataset: exactly (fmsdata's order), or as fms-fsdp does (``--order
fms-fsdp``, checked against get_data_loader in process and fms-fsdp's recorded batches)."""

import ast
import json
import os
import shutil

import pytest
from fms_corpus import batch_digest, make_corpus
from make_fms_fsdp_fixtures import generator_probe
from support import run_torchrun

from fmsdata.compat.fms_fsdp import get_data_loader
from fmsdata.data.indexing import index_root
from fmsdata.data.synthetic import write_corpus
from fmsdata.handlers import ArrowDocHandler

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "fms_fsdp_bamba.py")
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


def _rank_digests(log, rank):
    with open(f"{log}.rank{rank}") as handle:
        return [row["digest"] for row in map(json.loads, handle)]


def _reference(values, rank, world, steps):
    """The same ranks' batches from ``order="fms-fsdp"`` get_data_loader in this process."""
    it = iter(get_data_loader(values, rank, world, order="fms-fsdp"))
    return [batch_digest(next(it)) for _ in range(steps)]


@pytest.mark.slow  # two torchrun launches: ~35 s on 2 cores
def test_bamba_script_in_fms_fsdp_order_on_two_ranks_then_one(tmp_path):
    """``--order fms-fsdp`` under torchrun: 2 ranks give, step for step, the batches of
    get_data_loader in this process (and fms-fsdp's own, recorded by the oracle); a next
    stage on 1 rank continues the script's own step_6 saves with fms-fsdp's rescale, equal
    to the same resume here (and to fms-fsdp's rescaled resume of its step_6)."""
    fixture = json.load(open(os.path.join(HERE, "fixtures", "fms_fsdp_mamba_new.json")))
    spec = fixture["checkpoints"]["ck_w2_nw0"]  # 2 ranks, 0 workers, saves every 3
    oracle = generator_probe() == fixture["generator_probe"]  # fms-fsdp's draws apply
    config = {k: v for k, v in spec["config"].items() if v is not None}
    data = make_corpus(str(tmp_path / "data"), seed=fixture["corpus_seed"])
    common = {**config, "data_path": data, "report_interval": 4, "order": "fms-fsdp"}
    out = torchrun(
        2,
        tmp_path,
        **common,
        num_steps=8,
        ckpt_save_path=tmp_path / "stage1",
        batch_log=tmp_path / "stage1.log",
    )
    assert "step 8: loss" in out
    assert sorted(os.listdir(tmp_path / "stage1" / "fmsdata_fms_order")) == [
        "step_3_ckp",
        "step_6_ckp",
    ]
    values = {**spec["config"], "data_path": data}
    for rank in range(2):
        got = _rank_digests(tmp_path / "stage1.log", rank)
        own = {**values, "ckpt_save_path": str(tmp_path / f"ref{rank}")}
        assert got == _reference(own, rank, 2, 8), f"stage 1 rank {rank}"
        if oracle:
            assert got == spec["digests"][str(rank)][:8], f"stage 1 rank {rank} vs fms-fsdp"
        shutil.copytree(tmp_path / f"ref{rank}", tmp_path / "ref", dirs_exist_ok=True)

    out = torchrun(
        1,
        tmp_path,
        **common,
        num_steps=6,
        resuming_dataset=True,
        ckpt_load_path=tmp_path / "stage1",
        ckpt_save_path=tmp_path / "stage2",
        batch_log=tmp_path / "stage2.log",
    )
    assert "from step 0" in out
    got = _rank_digests(tmp_path / "stage2.log", 0)
    resumed = {**values, "resuming_dataset": True, "ckpt_load_path": str(tmp_path / "ref")}
    resumed["ckpt_save_path"] = str(tmp_path / "ref_next")
    assert got == _reference(resumed, 0, 1, 6), "stage 2"
    if oracle:
        assert got == spec["resumes"]["to_w1"]["digests"]["0"][:6], "stage 2 vs fms-fsdp"


def test_bamba_script_switches_by_one_import_line_and_shows_both_orders():
    with open(EXAMPLE) as handle:
        source = handle.read()
    doc = ast.get_docstring(ast.parse(source))
    fms = "from fms_fsdp.utils.dataloader_utils import get_data_loader, get_dummy_loader"
    ours = "from fmsdata.compat.fms_fsdp import get_data_loader, get_dummy_loader"
    assert fms in doc and ours in doc
    imports = [line for line in source.splitlines() if line.startswith(("from ", "import "))]
    assert ours in imports
    assert not [line for line in imports if line.startswith(("from fms_fsdp", "import fms_fsdp"))]
    assert "--order fms-fsdp" in doc and "--order fmsdata" in doc
    assert "get_data_loader(cfg, rank, world_size, order=order)" in source
