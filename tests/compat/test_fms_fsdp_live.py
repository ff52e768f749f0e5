"""fms-fsdp's own loader run live beside fmsdata (where its code is at hand).

``make_fms_fsdp_fixtures.py`` runs a subset of its cases (one subprocess per branch: both
are package ``fms_fsdp``) into ``tmp_path``. Its output must equal the committed fixtures
(the oracle is deterministic, and they were recorded by that script), and fmsdata's
``order="fms-fsdp"`` must give the digests it just recorded, resuming from the checkpoints
it just wrote. The second check holds on any torch build (both sides draw from the same
one); the first only where the generator probe matches the fixtures'.

fms-fsdp's trees are found by ``make_fms_fsdp_fixtures.peers_folder()``:
``$FMSDATA_FMS_FSDP_PEERS``, else ``shared/peers/fms-fsdp`` beside the repository.
Without them these tests skip, saying where they looked.
"""

import json
import os
import subprocess
import sys

import pytest
from fms_corpus import loader_digests as _digests
from fms_corpus import make_corpus
from make_fms_fsdp_fixtures import (
    BRANCHES,
    FIXTURES,
    OUTPUTS,
    fim_generator_probe,
    generator_probe,
    peers_folder,
)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_fms_fsdp_fixtures.py")
PEERS = peers_folder()
# A subset that still covers 2 ranks, 2 workers, BOS/EOL, PSM+SPM, and every kind of
# resume (same world size, 1 rank, 4 ranks, 2 workers; FIM's generator kept or not).
LIVE_CASES = {
    "mamba-new": ["w2_nw2", "w2_bos_eol", "ck_w2_nw0"],
    "mamba-fim": ["fim_w2_mix", "fim_ck_w2_nw0"],
}

needs_oracle = pytest.mark.skipif(
    not all(os.path.isdir(os.path.join(PEERS, b, "fms_fsdp")) for b in BRANCHES),
    reason=f"fms-fsdp's reference trees ({', '.join(BRANCHES)}) are not in {PEERS}; "
    "set FMSDATA_FMS_FSDP_PEERS to the folder that holds them",
)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    out = tmp_path_factory.mktemp("live")
    cases = ",".join(c for names in LIVE_CASES.values() for c in names)
    done = subprocess.run(
        [sys.executable, SCRIPT, "--peers", PEERS, "--out", str(out), "--cases", cases],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_corpus(str(tmp_path_factory.mktemp("livedata") / "data"), seed=0)


def _load(folder, branch):
    with open(os.path.join(folder, OUTPUTS[branch][0])) as handle:
        return json.load(handle)


@pytest.mark.slow  # fms-fsdp's loader in two interpreters: ~25 s on 2 cores
@needs_oracle
@pytest.mark.parametrize("branch", BRANCHES)
def test_live_oracle_equals_committed_fixtures(live, branch):
    got, committed = _load(live, branch), _load(FIXTURES, branch)
    probes = ("generator_probe", "fim_generator_probe")
    if any(got.get(k) != committed.get(k) for k in probes):
        pytest.skip(
            f"this torch ({got['torch']}) draws other values than the fixtures' "
            f"({committed['torch']}); fmsdata is still compared with the live run"
        )
    assert sorted([*got["cases"], *got["checkpoints"]]) == sorted(LIVE_CASES[branch])
    for key in ("oracle", "corpus_seed", "base"):
        assert got[key] == committed[key], key
    for name, record in got["cases"].items():
        assert record == committed["cases"][name], name
    for name, record in got["checkpoints"].items():
        # digests of the writing run, the loader_state_*.pth contents, every resume
        assert record == committed["checkpoints"][name], name


@pytest.mark.slow
@needs_oracle
@pytest.mark.parametrize("branch", BRANCHES)
def test_fmsdata_equals_the_live_oracle(live, branch, data, tmp_path):
    """Streams, the checkpointing run, and resumes from the .pth files fms-fsdp just wrote
    (order detected from them), every rank, every batch."""
    got = _load(live, branch)
    for name, spec in got["cases"].items():
        for rank in range(spec["world_size"]):
            values = {**spec["config"], "data_path": data, "ckpt_load_path": str(tmp_path)}
            values["ckpt_save_path"] = str(tmp_path / name / f"rank{rank}")
            digests = _digests(values, rank, spec["world_size"], spec["steps"], "fms-fsdp")
            assert digests == spec["digests"][str(rank)], f"{name} rank {rank}"
    for name, spec in got["checkpoints"].items():
        for rank in range(spec["world_size"]):
            values = {**spec["config"], "data_path": data, "ckpt_load_path": str(tmp_path)}
            values["ckpt_save_path"] = str(tmp_path / f"{name}_run" / f"rank{rank}")
            digests = _digests(values, rank, spec["world_size"], spec["steps"], "fms-fsdp")
            assert digests == spec["digests"][str(rank)], f"{name} rank {rank}"
        load = os.path.join(live, OUTPUTS[branch][1], name)
        for resume, run in spec["resumes"].items():
            for rank in range(run["world_size"]):
                values = {**spec["config"], "data_path": data, "num_workers": run["num_workers"]}
                values.update(resuming_dataset=True, ckpt_load_path=load)
                values["ckpt_save_path"] = str(tmp_path / f"{name}_{resume}" / f"rank{rank}")
                digests = _digests(values, rank, run["world_size"], run["steps"], None)
                assert digests == run["digests"][str(rank)], f"{name}/{resume} rank {rank}"


def test_peers_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FMSDATA_FMS_FSDP_PEERS", str(tmp_path))
    assert peers_folder() == str(tmp_path)
    monkeypatch.delenv("FMSDATA_FMS_FSDP_PEERS")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))
    expected = os.path.join(os.path.dirname(repo), "shared", "peers", "fms-fsdp")
    assert peers_folder() == os.path.normpath(expected)


def test_probes_are_importable_without_fms_fsdp():
    """The script's module is imported by the tests; fms_fsdp only in its subprocesses."""
    assert "fms_fsdp" not in sys.modules
    assert len(generator_probe()) == len(fim_generator_probe()) == 16
