"""order="fms-fsdp" with ``fim_training``: batches bit-identical to fms-fsdp mamba-fim's.

The digests were recorded by ``make_fms_fsdp_fixtures.py --branch mamba-fim`` running
mamba-fim's own loader (its ``FIMDataset``: minimum length 10, its cut-point draws,
PSM/SPM layouts, falsy FIM tokens left out) on the corpus rebuilt here from its seed.
"""

import json
import os
import shutil

import pytest
import torch
from fms_corpus import loader_digests as _digests
from fms_corpus import make_corpus
from make_fms_fsdp_fixtures import fim_generator_probe, generator_probe

from fmsdata.compat.fms_fsdp import get_data_loader
from fmsdata.errors import ConfigError

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = json.load(open(os.path.join(HERE, "fixtures", "fms_fsdp_mamba_fim.json")))
CKPTS = os.path.join(HERE, "fixtures", "fms_ckpt_fim")

pytestmark = pytest.mark.skipif(
    (generator_probe(), fim_generator_probe())
    != (FIXTURE["generator_probe"], FIXTURE["fim_generator_probe"]),
    reason=f"this torch ({torch.__version__}) draws other multinomial/randint/rand values "
    f"than the one the fixtures were recorded with ({FIXTURE['torch']})",
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_corpus(str(tmp_path_factory.mktemp("fim") / "data"), seed=FIXTURE["corpus_seed"])


@pytest.mark.parametrize("case", sorted(FIXTURE["cases"]))
def test_fim_stream_matches_mamba_fim(case, data, tmp_path):
    spec = FIXTURE["cases"][case]
    world = spec["world_size"]
    for rank in range(world):
        values = {**spec["config"], "data_path": data, "ckpt_load_path": str(tmp_path)}
        values["ckpt_save_path"] = str(tmp_path / f"rank{rank}")
        assert _digests(values, rank, world, spec["steps"]) == spec["digests"][str(rank)], rank


RESUMES = [(c, r) for c, spec in FIXTURE["checkpoints"].items() for r in spec["resumes"]]


@pytest.mark.parametrize("case,resume", RESUMES)
def test_fim_resume_from_mamba_fim_checkpoint(case, resume, data, tmp_path):
    """mamba-fim's checkpoints carry FIMDataset.g_state: restored on the same world size,
    left at the fresh seed on another (as mamba-fim does)."""
    spec = FIXTURE["checkpoints"][case]
    run = spec["resumes"][resume]
    load = shutil.copytree(os.path.join(CKPTS, case), tmp_path / "load")
    for rank in range(run["world_size"]):
        values = {**spec["config"], "data_path": data, "num_workers": run["num_workers"]}
        values.update(resuming_dataset=True, ckpt_load_path=str(load))
        values["ckpt_save_path"] = str(tmp_path / f"save{rank}")
        got = _digests(values, rank, run["world_size"], run["steps"], order=None)
        assert got == run["digests"][str(rank)], f"{case}/{resume} rank {rank}"


def test_fim_restart_from_own_checkpoints_continues(data, tmp_path):
    """fmsdata's own state in this order saves the FIM generator with the rest."""
    spec = FIXTURE["cases"]["fim_w2_mix"]
    job = tmp_path / "job"
    for rank in range(2):
        values = {**spec["config"], "data_path": data, "checkpoint_interval": 3}
        values["ckpt_save_path"] = values["ckpt_load_path"] = str(tmp_path / f"r{rank}")
        assert _digests(values, rank, 2, 7) == spec["digests"][str(rank)][:7]
        shutil.copytree(tmp_path / f"r{rank}", job, dirs_exist_ok=True)
    for rank in range(2):
        values = {**spec["config"], "data_path": data, "checkpoint_interval": 1000}
        values["ckpt_save_path"] = values["ckpt_load_path"] = str(job)
        got = _digests(values, rank, 2, spec["steps"] - 6, order=None)
        assert got == spec["digests"][str(rank)][6:]


@pytest.mark.parametrize(
    "over,match",
    [
        ({"bos_token": 1}, "bos_token=1.*no BOS"),
        ({"psm_rate": 0.0, "spm_rate": 0.0}, "psm_rate=0.0"),
        ({"psm_rate": 0.7, "spm_rate": 0.6}, "spm_rate=0.6"),
    ],
)
def test_fim_config_mamba_fim_refuses_is_a_config_error(over, match, data, tmp_path):
    values = {**FIXTURE["base"], "data_path": data, "ckpt_save_path": str(tmp_path), **over}
    with pytest.raises(ConfigError, match=match):
        next(iter(get_data_loader(values, 0, 1, order="fms-fsdp")))
