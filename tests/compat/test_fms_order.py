"""order="fms-fsdp": batches bit-identical to fms-fsdp mamba-new's own loader.

The expected digests were recorded by ``make_fms_fsdp_fixtures.py`` running fms-fsdp's
real code on the corpus ``fms_corpus.make_corpus`` rebuilds here from its seed. They hold
for the torch build whose generator draws match the recorded probe (fms-fsdp's order rests
on ``torch.multinomial`` / ``torch.randint``); another build skips, saying so.
"""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from fms_corpus import loader_digests as _digests
from fms_corpus import make_corpus
from make_fms_fsdp_fixtures import generator_probe

from fmsdata.compat.fms_fsdp import get_data_loader
from fmsdata.errors import ConfigError, EmptyDatasetError, StateMismatchError
from fmsdata.loader import FmsDataLoader
from fmsdata.state.file import load_state

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = json.load(open(os.path.join(HERE, "fixtures", "fms_fsdp_mamba_new.json")))
CKPTS = os.path.join(HERE, "fixtures", "fms_ckpt")

pytestmark = pytest.mark.skipif(
    generator_probe() != FIXTURE["generator_probe"],
    reason=f"this torch ({torch.__version__}) draws other multinomial/randint values than "
    f"the one the fixtures were recorded with ({FIXTURE['torch']}); fms-fsdp's order "
    "depends on them, so its digests do not apply",
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_corpus(str(tmp_path_factory.mktemp("fms") / "data"), seed=FIXTURE["corpus_seed"])


@pytest.mark.parametrize("case", sorted(FIXTURE["cases"]))
def test_stream_matches_fms_fsdp(case, data, tmp_path):
    spec = FIXTURE["cases"][case]
    world = spec["world_size"]
    for rank in range(world):
        values = {**spec["config"], "data_path": data, "ckpt_load_path": str(tmp_path)}
        values["ckpt_save_path"] = str(tmp_path / f"rank{rank}")
        got = _digests(values, rank, world, spec["steps"])
        assert got == spec["digests"][str(rank)], f"{case} rank {rank}"


RESUMES = [(c, r) for c, spec in FIXTURE["checkpoints"].items() for r in spec["resumes"]]


@pytest.mark.parametrize("case,resume", RESUMES)
def test_resume_from_fms_fsdp_checkpoint(case, resume, data, tmp_path):
    """fms-fsdp's own loader_state_*.pth, found by its rules under ckpt_load_path with
    resuming_dataset, continue exactly as fms-fsdp continues them (order detected)."""
    spec = FIXTURE["checkpoints"][case]
    run = spec["resumes"][resume]
    load = shutil.copytree(os.path.join(CKPTS, case), tmp_path / "load")
    for rank in range(run["world_size"]):
        values = {**spec["config"], "data_path": data, "num_workers": run["num_workers"]}
        values.update(resuming_dataset=True, ckpt_load_path=str(load))
        values["ckpt_save_path"] = str(tmp_path / f"save{rank}")
        got = _digests(values, rank, run["world_size"], run["steps"], order=None)
        assert got == run["digests"][str(rank)], f"{case}/{resume} rank {rank}"


def _save_own(spec, data, tmp_path, steps):
    """Run ``spec`` for ``steps`` batches per rank, saving every 3; the ranks' step
    folders gathered in one job folder, as a shared file system holds them."""
    job = tmp_path / "job"
    for rank in range(spec["world_size"]):
        values = {**spec["config"], "data_path": data, "checkpoint_interval": 3}
        values["ckpt_save_path"] = values["ckpt_load_path"] = str(tmp_path / f"r{rank}")
        assert (
            _digests(values, rank, spec["world_size"], steps) == spec["digests"][str(rank)][:steps]
        )
        shutil.copytree(tmp_path / f"r{rank}", job, dirs_exist_ok=True)
    return job


@pytest.mark.parametrize("case", ["w2_nw0", "w2_bos_eol", "w1_long_lines"])
def test_restart_from_own_checkpoints_continues_uninterrupted_stream(case, data, tmp_path):
    """fmsdata's own state files in this order (written like fms-fsdp's, at batch 7 for
    step 6; buffered lines as spans, BOS/EOS/BOL/EOL as literals) continue the
    uninterrupted stream, not fms-fsdp's resumed one."""
    spec = FIXTURE["cases"][case]
    job = _save_own(spec, data, tmp_path, 8)
    files = sorted(os.listdir(job / "fmsdata_fms_order" / "step_6_ckp"))
    assert files == [f"loader_state_{r}.fms" for r in range(spec["world_size"])]
    shutil.rmtree(job / "fmsdata_fms_order" / "step_3_ckp")
    steps = min(20, spec["steps"] - 6)
    for rank in range(spec["world_size"]):
        values = {**spec["config"], "data_path": data, "checkpoint_interval": 1000}
        values["ckpt_save_path"] = values["ckpt_load_path"] = str(job)
        got = _digests(values, rank, spec["world_size"], steps, order=None)
        assert got == spec["digests"][str(rank)][6 : 6 + steps]


def test_own_state_holds_spans_not_tokens(data, tmp_path):
    """Buffered lines are saved as spans: the state is a small fraction of the tokens
    it stands for (fms-fsdp's holds every token)."""
    spec = FIXTURE["cases"]["w1_long_lines"]
    job = _save_own(spec, data, tmp_path, 7)
    path = job / "fmsdata_fms_order" / "step_6_ckp" / "loader_state_0.fms"
    state = load_state(str(path))["chain"]
    buffered = sum(int(n) for n in state["preload"]["buffer"]["segments"]["n"])
    assert buffered >= 6 * (spec["config"]["seq_length"] + 1)
    assert len(state["preload"]["buffer"]["pool"]) == 0
    held = sum(np.asarray(col).nbytes for col in state["preload"]["buffer"]["segments"].values())
    assert held * 10 < buffered * 4  # under 10% of the tokens as int32


def test_own_state_that_does_not_fit_the_data_is_refused(tmp_path):
    """Spans are checked against the files on load: the same document counts with other
    tokens is a StateMismatchError naming the state file, the file and the values."""
    spec = FIXTURE["cases"]["w2_nw0"]
    data = make_corpus(str(tmp_path / "data"), seed=FIXTURE["corpus_seed"])
    job = _save_own(spec, data, tmp_path, 7)
    shutil.rmtree(data)
    make_corpus(data, seed=FIXTURE["corpus_seed"] + 1)  # same files and counts, new tokens
    values = {**spec["config"], "data_path": data, "checkpoint_interval": 1000}
    values["ckpt_save_path"] = values["ckpt_load_path"] = str(job)
    with pytest.raises(StateMismatchError, match=r"loader_state_0\.fms: preload.*\.arrow"):
        next(iter(get_data_loader(values, 0, 2, order=None)))


def test_own_save_after_resuming_fms_fsdp_tokens_continues(data, tmp_path):
    """Lines taken over from fms-fsdp's checkpoint (tokens, not spans) are saved with
    their tokens while still buffered; resuming that save continues fms-fsdp's stream."""
    spec = FIXTURE["checkpoints"]["ck_w2_nw0"]
    run = spec["resumes"]["same"]
    load = shutil.copytree(os.path.join(CKPTS, "ck_w2_nw0"), tmp_path / "load")
    job = tmp_path / "job"
    for rank in range(2):
        values = {**spec["config"], "data_path": data, "checkpoint_interval": 2}
        values.update(resuming_dataset=True, ckpt_load_path=str(load))
        values["ckpt_save_path"] = str(tmp_path / f"s{rank}")
        assert _digests(values, rank, 2, 3) == run["digests"][str(rank)][:3]
        shutil.copytree(tmp_path / f"s{rank}", job, dirs_exist_ok=True)
    saved = load_state(str(job / "fmsdata_fms_order" / "step_2_ckp" / "loader_state_0.fms"))
    assert len(saved["chain"]["preload"]["buffer"]["pool"]) > 0
    for rank in range(2):
        values = {**spec["config"], "data_path": data, "checkpoint_interval": 1000}
        values.update(resuming_dataset=True, ckpt_load_path=str(load))
        values["ckpt_save_path"] = str(job)
        got = _digests(values, rank, 2, run["steps"] - 2, order=None)
        assert got == run["digests"][str(rank)][2:]


def test_crafted_pth_is_refused_without_running(data, tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    step = tmp_path / "load" / "checkpoints" / "step_5_ckp"
    step.mkdir(parents=True)
    torch.save({"x": Payload()}, step / "loader_state_0.pth")
    values = {**FIXTURE["base"], "data_path": data, "resuming_dataset": True}
    values.update(ckpt_load_path=str(tmp_path / "load"), ckpt_save_path=str(tmp_path / "s"))
    with pytest.raises(StateMismatchError, match="loader_state_0.pth.*refused"):
        next(iter(get_data_loader(values, 0, 1, order="fms-fsdp")))
    assert not marker.exists()


def test_newest_step_without_loader_states_warns_and_uses_previous(data, tmp_path, caplog):
    spec = FIXTURE["checkpoints"]["ck_w2_nw0"]
    load = shutil.copytree(os.path.join(CKPTS, "ck_w2_nw0"), tmp_path / "load")
    (load / "checkpoints" / "step_9_ckp").mkdir()
    (load / "checkpoints" / "step_9_ckp" / "model.pth").write_bytes(b"")
    (load / "checkpoints" / "notes.txt").write_text("x")
    values = {**spec["config"], "data_path": data, "resuming_dataset": True}
    values.update(ckpt_load_path=str(load), ckpt_save_path=str(tmp_path / "s"))
    got = _digests(values, 0, 2, 4)
    assert got == spec["resumes"]["same"]["digests"]["0"][:4]
    assert "would start the data from scratch" in caplog.text
    assert "would crash" in caplog.text


def test_empty_document_first_in_single_file_shard_raises_instead_of_hanging(tmp_path):
    import pyarrow as pa

    folder = tmp_path / "data" / "one"
    folder.mkdir(parents=True)
    schema = pa.schema([("tokens", pa.uint32())])
    with pa.ipc.new_file(str(folder / "a.arrow"), schema) as writer:
        for doc in ([0], [0]):  # only EOS: empty once stripped
            writer.write_batch(pa.record_batch([pa.array(np.array(doc, np.uint32))], schema))
    values = {**FIXTURE["base"], "data_path": str(tmp_path / "data"), "datasets": "one"}
    values.update(weights="1", logical_shards=1, ckpt_save_path=str(tmp_path / "s"))
    with pytest.raises(EmptyDatasetError, match="a.arrow|logical shard 0"):
        next(iter(get_data_loader(values, 0, 1, order="fms-fsdp")))


def test_order_is_fmsdata_without_fms_checkpoints(data, tmp_path):
    values = {**FIXTURE["base"], "data_path": data, "ckpt_save_path": str(tmp_path)}
    values["file_type"] = "arrow"
    assert isinstance(get_data_loader(values, 0, 1), FmsDataLoader)
    assert not isinstance(get_data_loader(values, 0, 1, order="fms-fsdp"), FmsDataLoader)


@pytest.mark.parametrize("resume", ["to_w1", "to_w4", "to_w2_nw2"])
def test_own_checkpoints_rescale_as_fms_fsdp_rescales(resume, data, tmp_path):
    """fmsdata's own step_6 states of a 2-rank job, resumed on another world size or
    worker count, continue exactly as fms-fsdp continues its own step_6 checkpoint there
    (buffers re-dealt, each logical shard's pass restarted where its state says)."""
    spec = FIXTURE["checkpoints"]["ck_w2_nw0"]
    run = spec["resumes"][resume]
    job = _save_own(spec, data, tmp_path, 7)
    shutil.rmtree(job / "fmsdata_fms_order" / "step_3_ckp")
    for rank in range(run["world_size"]):
        values = {**spec["config"], "data_path": data, "num_workers": run["num_workers"]}
        values.update(resuming_dataset=True, ckpt_load_path=str(job), checkpoint_interval=1000)
        values["ckpt_save_path"] = str(job)
        got = _digests(values, rank, run["world_size"], run["steps"], order=None)
        assert got == run["digests"][str(rank)], f"{resume} rank {rank}"


def _write_counts(data, rows):
    os.makedirs(os.path.join(data, "meta"), exist_ok=True)
    with open(os.path.join(data, "meta", "file_counts.csv"), "w") as f:
        f.write("dataset/filename,documents,tokens\n")
        f.writelines(f"corpus/code/{name},{n},0\n" for name, n in rows)


def test_meta_counts_csv_gives_the_document_counts(tmp_path):
    """A ``meta/*counts*.csv`` beside the dataset folder gives the document counts
    (fms-fsdp reads it instead of the files): true counts give fms-fsdp's stream; a file
    it does not list is a ConfigError naming the file."""
    spec = FIXTURE["cases"]["w2_l8_one_dataset"]
    data = make_corpus(str(tmp_path / "data"), seed=FIXTURE["corpus_seed"])
    _write_counts(data, [("x/b.arrow", 11), ("a.arrow", 29), ("c.arrow", 5)])
    for rank in range(2):
        values = {**spec["config"], "data_path": data, "ckpt_save_path": str(tmp_path / "s")}
        assert _digests(values, rank, 2, 10) == spec["digests"][str(rank)][:10]
    _write_counts(data, [("x/b.arrow", 11), ("a.arrow", 29)])
    values = {**spec["config"], "data_path": data, "ckpt_save_path": str(tmp_path / "s")}
    with pytest.raises(ConfigError, match="c.arrow"):
        next(iter(get_data_loader(values, 0, 2, order="fms-fsdp")))


@pytest.mark.parametrize("resume", ["same", "to_w1"])
def test_fms_fsdp_token_lines_are_held_as_int32(resume, data, tmp_path):
    """fms-fsdp's buffered lines (lists of ints in its .pth) are taken over into one int32
    pool, as its batches are int32 (half of int64's 328 MB at 10,000 lines of 4,097), and
    the continuation is still bit-identical, on the same and on another world size."""
    spec = FIXTURE["checkpoints"]["ck_w2_nw0"]
    run = spec["resumes"][resume]
    load = shutil.copytree(os.path.join(CKPTS, "ck_w2_nw0"), tmp_path / "load")
    step = load / "checkpoints" / spec["kept"]
    saved = [torch.load(step / f"loader_state_{r}.pth", weights_only=True) for r in range(2)]
    lines = [len(x) for s in saved for x in s["PreloadBufferDataset.buffer"]]
    for rank in range(run["world_size"]):
        values = {**spec["config"], "data_path": data, "resuming_dataset": True}
        values.update(ckpt_load_path=str(load), ckpt_save_path=str(tmp_path / f"s{rank}"))
        dataset = get_data_loader(values, rank, run["world_size"], order=None).dataset
        chain, _, _ = dataset.build()
        pool = chain.tokens.pool
        assert pool.dtype == np.int32
        if resume == "same":
            carry = len(saved[rank]["BufferDataset.buffer"])
            held = sum(len(x) for x in saved[rank]["PreloadBufferDataset.buffer"])
            assert len(pool) == held + carry
        else:
            assert len(pool) >= sum(lines)  # both ranks' lines, re-dealt to one
        got = _digests(values, rank, run["world_size"], run["steps"], order=None)
        assert got == run["digests"][str(rank)], f"{resume} rank {rank}"


def test_fms_fsdp_token_outside_int32_is_refused(data, tmp_path):
    spec = FIXTURE["checkpoints"]["ck_w2_nw0"]
    load = shutil.copytree(os.path.join(CKPTS, "ck_w2_nw0"), tmp_path / "load")
    path = load / "checkpoints" / spec["kept"] / "loader_state_0.pth"
    state = torch.load(path, weights_only=True)
    state["PreloadBufferDataset.buffer"][3][5] = 2**40
    torch.save(state, path)
    values = {**spec["config"], "data_path": data, "resuming_dataset": True}
    values.update(ckpt_load_path=str(load), ckpt_save_path=str(tmp_path / "s"))
    with pytest.raises(StateMismatchError, match=r"loader_state_0\.pth.*buffer\[3\].*int32"):
        next(iter(get_data_loader(values, 0, 2, order=None)))


@pytest.mark.parametrize("resume", ["same", "to_w1"])
def test_next_stage_resumes_own_checkpoints_from_ckpt_load_path(resume, data, tmp_path):
    """A next stage (``resuming_dataset``, a new ``ckpt_save_path``) continues fmsdata's own
    saves in this order from ``ckpt_load_path``, as fms-fsdp continues its .pth from there:
    order detected, the step count restarted (the next save is the new stage's step 3)."""
    spec = FIXTURE["checkpoints"]["ck_w2_nw0"]
    run = spec["resumes"][resume]
    job = _save_own(spec, data, tmp_path, 7)
    shutil.rmtree(job / "fmsdata_fms_order" / "step_3_ckp")
    for rank in range(run["world_size"]):
        values = {**spec["config"], "data_path": data, "num_workers": run["num_workers"]}
        values.update(resuming_dataset=True, ckpt_load_path=str(job))
        # one folder per rank: run one after another, a later rank would restart from an
        # earlier one's new saves (in a job all ranks start before anyone saves)
        values["ckpt_save_path"] = str(tmp_path / f"next{rank}")
        got = _digests(values, rank, run["world_size"], 4, order=None)
        assert got == run["digests"][str(rank)][:4], f"{resume} rank {rank}"
        assert os.listdir(tmp_path / f"next{rank}" / "fmsdata_fms_order") == ["step_3_ckp"]


def test_an_unreadable_arrow_file_is_refused_by_name(tmp_path):
    """A listed file that is gone, or is not an Arrow file, is a ShardFormatError naming
    it (the fms-order reader opens files through fmsdata's Arrow handler)."""
    from fmsdata.compat.fms_order.arrowdocs import ArrowDocs
    from fmsdata.errors import ShardFormatError

    garbage = tmp_path / "bad.arrow"
    garbage.write_bytes(b"not arrow at all")
    for path in (tmp_path / "gone.arrow", garbage):
        docs = ArrowDocs([str(path)], ("tokens",), frozenset())
        with pytest.raises(ShardFormatError, match=path.name):
            docs.count(0)
