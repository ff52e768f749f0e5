"""Issue 46: a rank's start over S3 costs the same requests whatever the number of ranks,
and none lists the whole root when ``meta/counts.csv`` exists.

Counts, never times, taken by the S3 proxy (the requests the server answers, each tagged
with its rank), for ranks of jobs of 2 and 16 ranks started one after another as fresh
processes would be (``rankstarts``); ``benchmarks/remote.py`` starts them at once.
"""

import json
import re

import pytest
import yaml
from rankstarts import per_rank, rank_config, start_rank, whole_listings
from s3local import upload_tree
from support import base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.checkpoint import save_loader_state
from fmsdata.cli.main import main
from fmsdata.data.indexing import index_root
from fmsdata.handlers import ArrowDocHandler

pytestmark = pytest.mark.remote

SHARDS = 16
WORLDS = (2, 16)


@pytest.fixture
def job(tmp_path, s3, bucket, proxy):
    """A root with counts metadata in the bucket, and the config of its ranks (through a
    recording proxy)."""
    info = corpus(tmp_path / "data", {"a": 6, "b": 4}, docs_per_file=40)
    upload_tree(s3.client(), bucket, info.root, "bare")
    index_root(info.root, ArrowDocHandler())
    upload_tree(s3.client(), bucket, info.root, "root")
    recorder = proxy()
    config = {
        **base_config(info, logical_shards=SHARDS, batch_size=8),
        "data_path": f"s3://{bucket}/root",
        "endpoint_url": recorder.url,
        "remote_backoff": 0.01,
    }
    return config, recorder


def starts(config, recorder, tmp_path, world, resume_from=None):
    """Ranks 0 and world - 1 of a job of ``world`` ranks, each started as a fresh process
    on a node of its own (an empty cache): the requests of each."""
    found = {}
    for rank in sorted({0, world - 1}):
        mark = len(recorder.log)
        cache = tmp_path / f"cache-{world}-{rank}-{resume_from is not None}"
        start_rank(rank_config(config, rank, str(cache)), rank, world, resume_from)
        found[rank] = per_rank(recorder.log[mark:], [rank])[rank]
    return found


def saved_by_two_ranks(config, bucket, tmp_path):
    folder = f"s3://{bucket}/ckpt/step_2"
    for rank in (0, 1):
        loader = build_dataloader(
            {**config, "cache_dir": str(tmp_path / "save")}, rank=rank, world_size=2
        )
        take(loader, 2)
        save_loader_state(loader, folder)
    return folder


@pytest.mark.slow  # multi-process: in the slow tier (the default run stays under 5 min)
def test_requests_per_rank_do_not_grow_with_the_number_of_ranks(job, tmp_path, bucket):
    """Every kind of request (LIST, HEAD, GET, PUT) and the bytes read, of a fresh start
    and of a resume (from a save of 2 ranks: a rescale beyond 2), at 2 and 16 ranks: no
    rank of a larger job asks more than the most a rank of the smallest asks."""
    config, recorder = job
    folder = saved_by_two_ranks(config, bucket, tmp_path)
    for resume_from in (None, folder):
        table = {w: starts(config, recorder, tmp_path, w, resume_from) for w in WORLDS}
        smallest = table[WORLDS[0]]
        for world in WORLDS[1:]:
            for kind in ("LIST", "HEAD", "GET", "PUT", "bytes"):
                most = max(counts[kind] for counts in smallest.values())
                for rank, counts in table[world].items():
                    assert counts[kind] <= most, (resume_from, world, rank, kind, table)
        # Each rank read its files (the comparison is not vacuous).
        for counts in (c for row in table.values() for c in row.values()):
            assert counts["GET"] >= 2 and counts["bytes"] > 0, table


@pytest.mark.slow  # multi-process: in the slow tier (the default run stays under 5 min)
def test_no_rank_lists_the_whole_root_when_counts_exist(job, tmp_path, bucket):
    config, recorder = job
    folder = saved_by_two_ranks(config, bucket, tmp_path)
    mark = len(recorder.log)
    for world in (2, 16):
        starts(config, recorder, tmp_path, world)
        starts(config, recorder, tmp_path, world, folder)
    assert whole_listings(recorder.log[mark:], "root") == []
    # What the check would catch: a root without counts is listed whole (every dataset
    # folder, recursively), by every rank.
    mark = len(recorder.log)
    bare = {**config, "data_path": f"s3://{bucket}/bare"}
    start_rank(rank_config(bare, 0, str(tmp_path / "cache-bare")), 0, 2)
    listed = [r.prefix for r in recorder.log[mark:] if r.kind == "LIST" and r.recursive]
    assert listed, "a root without counts.csv is listed file by file"


def test_calls_counted_by_fmsdata_match_the_requests_the_server_saw(job, tmp_path):
    """``fmsdata.remote.requests`` (what ``fmsdata bench`` prints) against the proxy's
    record of the same start: the same bytes read, and at least as many calls of each kind
    as requests (a call answered from fsspec's listing cache, or one that failed, such as
    the read of an absent ``metadata.json``, sends no request or gets no body)."""
    config, recorder = job
    mark = len(recorder.log)
    found = start_rank(rank_config(config, 0, str(tmp_path / "cache")), 0, 4)
    seen = per_rank(recorder.log[mark:], [0])[0]
    calls = found["calls"]
    assert calls["bytes"] == seen["bytes"] > 0
    assert calls["GET"] >= seen["GET"] > 0
    assert calls["LIST"] + calls["HEAD"] >= seen["LIST"] + seen["HEAD"] > 0


def test_bench_on_a_remote_root_prints_requests_and_bytes_per_rank(job, tmp_path, capsys):
    """``fmsdata bench`` counts the calls of its process and of its DataLoader worker: the
    bytes it reports are those of the objects the server sent."""
    config, recorder = job
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**config, "cache_dir": str(tmp_path / "cache")}))
    argv = ["bench", str(path), "num_workers=1", "--batches", "2", "--seconds", "0"]
    mark = len(recorder.log)
    assert main([*argv, "--warmup", "0", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    seen = per_rank([r for r in recorder.log[mark:] if r.rank == -1], [-1])[-1]
    assert figures["requests"]["bytes"] == seen["bytes"] > 0  # the worker's reads included
    assert figures["requests"]["GET"] >= seen["GET"]
    first = figures["requests_first_batch"]
    assert 0 < first["GET"] <= figures["requests"]["GET"]
    assert main([*argv, "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"requests/rank   to 1st batch: \d+ LIST, \d+ HEAD, \d+ GET; [\d.]+ MB", out)
