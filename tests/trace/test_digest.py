"""Per-step digests: a loader's ``step_digest`` (``return_step_digest``), a training log of
them, and ``verify_digests`` naming the first step whose batch differs; ``Tracer.batch``
gives each rank's tokens as delivered."""

import json

import numpy as np
import pytest
import torch
from support import base_config, corpus, take

from fmsdata import ConfigError, build_dataloader
from fmsdata.trace import (
    Tracer,
    batch_digest,
    combine_digests,
    digest_hex,
    read_digest_log,
    verify_digests,
)


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("corpus"))


def logged_run(config, world_size, steps):
    """Each rank's batches, and the log lines a training loop writes (rank, step, digest)."""
    lines, batches = [], []
    for rank in range(world_size):
        loader = build_dataloader(config, rank=rank, world_size=world_size)
        mine = []
        for batch in loader:
            mine.append(batch)
            lines.append(
                {"step": loader.steps, "rank": rank, "digest": digest_hex(batch["step_digest"])}
            )
            if len(mine) == steps:
                break
        batches.append(mine)
    return batches, lines


def write_log(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("extra", [{}, {"output_dtype": "int32", "ignore_first_labels": 2}])
def test_batches_are_told_token_for_token(info, extra):
    config = base_config(info, **extra)
    delivered, _ = logged_run({**config, "return_step_digest": True}, 2, 4)
    tracer = Tracer(config, world_size=2)
    for step in range(1, 5):
        for rank, told in enumerate(tracer.batch(step)):
            got = delivered[rank][step - 1]
            for key in ("input_ids", "labels"):
                assert told[key].dtype == np.dtype(got[key].numpy().dtype)
                assert np.array_equal(told[key], got[key].numpy()), (step, rank, key)


def test_a_digest_is_of_the_batch_whatever_its_dtype(info):
    config = base_config(info, return_step_digest=True)
    wide = take(build_dataloader(config), 2)[1]
    narrow = take(build_dataloader({**config, "output_dtype": "int32"}), 2)[1]
    assert int(wide["step_digest"]) == int(narrow["step_digest"])
    assert digest_hex(wide["step_digest"]) == batch_digest(wide["input_ids"], wide["labels"])
    assert wide["step_digest"].dtype == torch.int64 and wide["step_digest"].dim() == 0


def test_a_log_of_digests_is_verified_and_a_difference_named(info, tmp_path):
    config = base_config(info, return_step_digest=True)
    _, lines = logged_run(config, 2, 6)
    tracer = Tracer(config, world_size=2)
    report = verify_digests(tracer, read_digest_log(write_log(tmp_path / "ok.jsonl", lines)))
    assert report.ok and report.checked == 6
    tampered = [dict(line) for line in lines]
    tampered[8]["digest"] = "00" * 8  # rank 1's step 3
    report = verify_digests(tracer, read_digest_log(write_log(tmp_path / "bad.jsonl", tampered)))
    assert (report.step, report.rank, report.checked) == (3, 1, 2)


def test_gathered_and_combined_digests_are_verified(info, tmp_path):
    config = base_config(info, return_step_digest=True)
    _, lines = logged_run(config, 2, 4)
    by_step = {}
    for line in lines:
        by_step.setdefault(line["step"], [None, None])[line["rank"]] = line["digest"]
    gathered = [{"step": s, "digests": d} for s, d in by_step.items()]
    combined = [{"step": s, "digest": combine_digests(d)} for s, d in by_step.items()]
    tracer = Tracer(config, world_size=2)
    for name, log in (("gathered", gathered), ("combined", combined)):
        assert verify_digests(tracer, read_digest_log(write_log(tmp_path / name, log))).ok
    # Another version of the data: the run over it is told apart at its first step.
    other = corpus(tmp_path / "other", seed=1)
    report = verify_digests(
        Tracer(base_config(other), world_size=2),
        read_digest_log(write_log(tmp_path / "combined", combined)),
    )
    assert report.step == 1 and report.rank is None


def test_a_digest_log_that_does_not_read_is_refused(tmp_path):
    for text, match in [
        ("not json\n", "line 1: not JSON"),
        ('{"rank": 0}\n', "integer 'step'"),
        ('{"step": 1}\n', "no 'digest'"),
        ('{"step": 1, "digest": "xyz"}\n', "unreadable digest"),
    ]:
        (tmp_path / "log.jsonl").write_text(text)
        with pytest.raises(ConfigError, match=match):
            read_digest_log(tmp_path / "log.jsonl")


def test_a_preprocess_cannot_be_digested(info):
    with pytest.raises(ConfigError, match="return_step_digest"):
        build_dataloader(base_config(info, return_step_digest=True), preprocess=lambda line, n: {})
