"""Issue 45: loader checkpoints in object storage (a moto S3 server on loopback).

Before, ``save_loader_state(loader, "s3://ckpts/run1/step10")`` wrote a local folder named
``s3:`` and nothing reached the bucket; automatic checkpoints did the same. Each test runs
in a fresh current folder and checks that no such folder appears, and that what the
bucket holds resumes the loader exactly (the continuation compared with an unbroken run).
"""

import json
import os
import signal
import subprocess
import sys

import pytest
from support import assert_same_batches, base_config, corpus, global_steps, rank_loaders, take

from fmsdata import build_dataloader
from fmsdata.checkpoint import (
    latest_checkpoint,
    load_loader_state,
    rank_files,
    save_loader_state,
    step_folders,
)
from fmsdata.cli.main import main
from fmsdata.errors import ConfigError, StateMismatchError
from fmsdata.remote.retry import RetryPolicy
from fmsdata.remote.storage import Storage

pytestmark = pytest.mark.remote

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A fresh current folder: where the old code made its ``s3:`` folder."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    assert os.listdir(cwd) == [], "something was written to the current folder"


@pytest.fixture
def endpoint(s3, aws_env, monkeypatch):
    """The endpoint given as users give it: ``AWS_ENDPOINT_URL``, no fmsdata option."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)
    return s3.url


def keys(s3, bucket, prefix=""):
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(entry["Key"] for entry in listed.get("Contents", []))


def test_save_and_load_round_trip_exactly_through_the_bucket(tmp_path, here, endpoint, s3, bucket):
    info = corpus(tmp_path / "data")
    config = base_config(info, num_workers=1)
    reference = take(build_dataloader(config), 20)
    loader = build_dataloader(config)
    take(loader, 10)
    url = f"s3://{bucket}/run1/step10"
    written = save_loader_state(loader, url)
    assert written == f"{url}/loader_rank_00000.fms"
    assert keys(s3, bucket) == [
        "run1/step10/loader_rank_00000.fms",
        "run1/step10/loader_rank_00000.world_1.step_10.done",
    ]
    assert rank_files(url) == {0: written}
    fresh = build_dataloader(config)
    load_loader_state(fresh, url)
    assert fresh.steps == 10
    assert_same_batches(reference[10:], take(fresh, 10))


def test_automatic_checkpoints_go_to_the_bucket_and_resume(tmp_path, here, endpoint, s3, bucket):
    info = corpus(tmp_path / "data")
    root = f"s3://{bucket}/auto"
    config = base_config(info, checkpoint_dir=root, checkpoint_every=5, checkpoint_keep=2)
    plain = {**config, "checkpoint_dir": None, "checkpoint_every": 0}
    reference = take(build_dataloader(plain), 30)
    loader = build_dataloader(config)
    assert_same_batches(reference[:12], take(loader, 12))
    loader.close()
    assert step_folders(root) == ["step_000000005", "step_000000010"]
    assert latest_checkpoint(root) == f"{root}/step_000000010"
    resumed = build_dataloader(config)  # a restarted job finds it by itself
    assert resumed.steps == 10
    assert_same_batches(reference[10:23], take(resumed, 13))
    resumed.close()
    # keep=2: steps 15 and 20 remain, 5 and 10 were removed object by object.
    assert step_folders(root) == ["step_000000015", "step_000000020"]
    assert {k.split("/")[1] for k in keys(s3, bucket, "auto/")} == {
        "step_000000015",
        "step_000000020",
    }


def test_storage_options_of_the_config_reach_the_checkpoints(tmp_path, here, s3, aws_env, bucket):
    """No AWS_ENDPOINT_URL: the config's endpoint_url, the data root's option, is used."""
    info = corpus(tmp_path / "data")
    config = base_config(
        info, endpoint_url=s3.url, checkpoint_dir=f"s3://{bucket}/auto", checkpoint_every=2
    )
    loader = build_dataloader(config)
    take(loader, 4)
    loader.close()
    assert "AWS_ENDPOINT_URL" not in os.environ
    assert keys(s3, bucket, "auto/step_000000004/") == [
        "auto/step_000000004/loader_rank_00000.fms",
        "auto/step_000000004/loader_rank_00000.world_1.step_4.done",
    ]
    assert build_dataloader(config).steps == 4
    # A Storage given explicitly is used as given: here one that reaches the server.
    fresh = build_dataloader(base_config(info))
    storage = Storage(endpoint_url=s3.url, retry=RetryPolicy(tries=1))
    load_loader_state(fresh, f"s3://{bucket}/auto/step_000000004", storage=storage)
    assert fresh.steps == 4


def test_state_show_reads_a_checkpoint_in_the_bucket(tmp_path, here, endpoint, s3, bucket, capsys):
    info = corpus(tmp_path / "data")
    root = f"s3://{bucket}/auto"
    loader = build_dataloader(base_config(info, checkpoint_dir=root, checkpoint_every=3))
    take(loader, 7)
    loader.close()
    local = tmp_path / "local"
    save_loader_state(loader, local)
    assert main(["state", "show", str(local), "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    assert expected["steps"] == 7
    for path, where in [
        (root, f"{root}/step_000000006"),
        (f"{root}/step_000000006", f"{root}/step_000000006"),
        (f"{root}/step_000000006/loader_rank_00000.fms", None),
    ]:
        assert main(["state", "show", path, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["path"] == (where or path)
        assert shown["steps"] == 6 and shown["world_size"] == 1
        assert shown["datasets"].keys() == expected["datasets"].keys()
    assert main(["state", "show", f"s3://{bucket}/nothing"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    # A torch.distributed.checkpoint folder is read from local disk only: refused by name.
    s3.client().put_object(Bucket=bucket, Key="dcp/step_5/.metadata", Body=b"")
    assert main(["state", "show", f"s3://{bucket}/dcp/step_5"]) == 2
    err = capsys.readouterr().err
    assert f"PATH='s3://{bucket}/dcp/step_5': must be a path on this machine" in err


def test_a_save_into_a_missing_bucket_fails_naming_it(tmp_path, here, endpoint):
    loader = build_dataloader({**base_config(corpus(tmp_path / "data")), "remote_retries": 1})
    take(loader, 2)
    with pytest.raises(OSError, match="s3://no-such-bucket-here/x/loader_rank_00000.fms"):
        save_loader_state(loader, "s3://no-such-bucket-here/x")


@pytest.mark.parametrize("bad", ["s4://b/x", "simplecache::s3://b/x", "https://host/x"])
def test_an_unusable_url_is_refused_by_name(tmp_path, here, bad):
    loader = build_dataloader(base_config(corpus(tmp_path / "data")))
    with pytest.raises(ConfigError, match=r"save_loader_state\(ckpt_dir\)=.*" + bad[:4]):
        save_loader_state(loader, bad)
    with pytest.raises(ConfigError, match=r"checkpoint_dir="):
        build_dataloader(base_config(corpus(tmp_path / "d2"), checkpoint_dir=bad))


def run_ranks(config, world, steps, tmp_path, tag):
    """``world`` rank processes of ``ckpt_rank.py``; their outputs once all exited."""
    script = os.path.join(HERE, "ckpt_rank.py")
    outs = [tmp_path / f"{tag}-rank{r}.json" for r in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, script, json.dumps(config), str(r), str(world), str(steps), out]
        )
        for r, out in enumerate(outs)
    ]
    for proc in procs:
        assert proc.wait(timeout=300) == 0
    return [json.loads(out.read_text()) for out in outs]


def rows_by_step(results):
    """Per global step, the sorted rows of every rank (as ``global_steps`` gives them)."""
    n = len(results[0]["batches"])
    return [sorted(tuple(row) for r in results for row in r["batches"][s]) for s in range(n)]


@pytest.mark.slow  # 2 rank processes with 2 workers each, then resumes on 1 and 4 ranks
def test_two_ranks_with_two_workers_checkpoint_into_one_folder_and_rescale(
    tmp_path, here, endpoint, s3, bucket
):
    info = corpus(tmp_path / "data", {"a": 4, "b": 3})
    root = f"s3://{bucket}/job/auto"
    plain = base_config(info, logical_shards=8, batch_size=4, num_workers=0)
    config = {
        **plain,
        "num_workers": 2,
        "checkpoint_dir": root,
        "checkpoint_every": 3,
        "checkpoint_keep": 2,
    }
    reference = global_steps(rank_loaders(plain, 2), 20)
    results = run_ranks(config, 2, 12, tmp_path, "first")
    assert [r["start"] for r in results] == [0, 0]
    assert rows_by_step(results) == reference[:12]
    assert latest_checkpoint(root) == f"{root}/step_000000012"
    # Rank 0 prunes after each of its saves, keeping the newest 2 complete ones: how far
    # rank 1 had got by then decides what is left (all four folders, when rank 0 ran ahead
    # of it), but the newest two complete saves are always there.
    assert step_folders(root)[-2:] == ["step_000000009", "step_000000012"]
    assert set(step_folders(root)) <= {f"step_{3 * k:09d}" for k in range(1, 5)}
    assert len(keys(s3, bucket, "job/auto/step_000000012/")) == 4  # 2 files, 2 markers
    for world in (1, 4):  # another world size, exact: the steps the 2-rank run would take
        loaders = rank_loaders(
            {**config, "num_workers": 0, "checkpoint_every": 0}, world, batch_size=8 // world
        )
        assert [loader.steps for loader in loaders] == [12] * world
        assert global_steps(loaders, 8) == reference[12:20]
    # The job itself restarted on 2 ranks, 2 workers each, from the bucket.
    again = run_ranks(config, 2, 8, tmp_path, "again")
    assert [r["start"] for r in again] == [12, 12]
    assert rows_by_step(again) == reference[12:20]


@pytest.mark.slow  # rank processes, one killed with SIGKILL in the middle of an upload
def test_a_rank_killed_mid_save_leaves_the_previous_step_loadable(
    tmp_path, here, endpoint, s3, bucket, proxy
):
    info = corpus(tmp_path / "data")
    root = f"s3://{bucket}/auto"
    plain = base_config(info, logical_shards=4, batch_size=4)
    config = {**plain, "checkpoint_dir": root, "checkpoint_every": 5, "checkpoint_keep": 1}
    reference = global_steps(rank_loaders(plain, 2), 16)
    stall = proxy(hold="auto/step_000000010/loader_rank_00001.fms")
    script = os.path.join(HERE, "ckpt_rank.py")
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    configs = [config, {**config, "endpoint_url": stall.url}]  # rank 1 goes through the proxy
    procs = [
        subprocess.Popen(
            [sys.executable, script, json.dumps(configs[r]), str(r), "2", "12", outs[r]]
        )
        for r in range(2)
    ]
    try:
        assert stall.held.wait(timeout=240), "rank 1 never started its step-10 upload"
        procs[1].send_signal(signal.SIGKILL)  # half its state file sent
        assert procs[1].wait(timeout=60) == -signal.SIGKILL
        assert procs[0].wait(timeout=240) == 0
    finally:
        stall.release.set()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    # Rank 0 wrote step 10 and pruned nothing it needs: step 5 is the newest complete save.
    assert step_folders(root) == ["step_000000005", "step_000000010"]
    assert keys(s3, bucket, "auto/step_000000010/") == [
        "auto/step_000000010/loader_rank_00000.fms",
        "auto/step_000000010/loader_rank_00000.world_2.step_10.done",
    ]
    assert latest_checkpoint(root) == f"{root}/step_000000005"
    with pytest.raises(StateMismatchError, match="missing: loader_rank_00001.fms"):
        load_loader_state(build_dataloader(plain, rank=0, world_size=2), f"{root}/step_000000010")
    for world in (2, 1):
        loaders = rank_loaders(
            {**config, "checkpoint_every": 0}, world, batch_size=8 // world
        )  # build_dataloader resumes from the newest complete save by itself
        assert [loader.steps for loader in loaders] == [5] * world
        assert global_steps(loaders, 11) == reference[5:16]


def test_the_fms_fsdp_entry_point_keeps_its_loader_checkpoints_in_the_bucket(
    tmp_path, here, endpoint, s3, bucket
):
    from fmsdata.compat.fms_fsdp import LOADER_CHECKPOINTS, get_data_loader

    info = corpus(tmp_path / "data")
    cfg = {
        "data_path": info.root,
        "datasets": "a,b",
        "weights": "3,1",
        "seq_length": 24,
        "logical_shards": 4,
        "num_workers": 0,
        "batch_size": 2,
        "checkpoint_interval": 4,
        "ckpt_save_path": f"s3://{bucket}/run1",
        "ckpt_load_path": f"s3://{bucket}/run1",
    }

    def rows(loader, n):
        out = []
        for step, (inputs, _) in enumerate(loader, start=1):
            out.append(inputs.tolist())
            if step == n:
                return out

    first = get_data_loader(cfg, 0, 1)
    reference = rows(first, 11)
    first.checkpointer.wait()
    assert step_folders(f"s3://{bucket}/run1/{LOADER_CHECKPOINTS}") == [
        "step_000000004",
        "step_000000008",
    ]
    restarted = get_data_loader(cfg, 0, 1)  # a restarted job: its own save path
    assert restarted.steps == 8
    assert rows(restarted, 3) == reference[8:11]
    stage2 = {**cfg, "ckpt_save_path": f"s3://{bucket}/run2", "resuming_dataset": True}
    resumed = get_data_loader(stage2, 0, 1)  # the next stage: from ckpt_load_path
    assert rows(resumed, 3) == reference[8:11]
    with pytest.raises(ConfigError, match="ckpt_save_path='s3://"):
        get_data_loader(cfg, 0, 1, order="fms-fsdp")


def test_a_resume_costs_a_rank_the_same_requests_whatever_the_world_size(
    tmp_path, here, endpoint, s3, bucket, proxy
):
    """Completeness is read off one listing (markers), never off every rank's file: rank 0
    of 8 ranks resumes with the requests rank 0 of 2 does (reading each header was 8)."""
    info = corpus(tmp_path / "data")
    config = base_config(info, logical_shards=8)
    counted = {}
    for world in (2, 8):
        root = f"s3://{bucket}/w{world}"
        for loader in rank_loaders(config, world, batch_size=16 // world):
            take(loader, 3)
            save_loader_state(loader, f"{root}/step_000000003")
        counting = proxy()
        fresh = build_dataloader(
            {**config, "batch_size": 16 // world, "endpoint_url": counting.url},
            rank=0,
            world_size=world,
        )
        storage = Storage.from_config(fresh.config.remote)
        latest = latest_checkpoint(root, storage=storage)
        load_loader_state(fresh, latest)
        assert fresh.steps == 3
        counted[world] = counting.requests
    # Listings of the root and of the step folder (latest_checkpoint), of the step folder
    # again (the load), and this rank's one state file.
    assert counted[2] == counted[8] == 4, counted
