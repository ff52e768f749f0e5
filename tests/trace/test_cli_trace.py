"""``fmsdata trace`` on the command line: ``--step`` (text and JSON), ``--doc``,
``--batch`` (``.npy`` and printed), ``--verify`` and ``--checkpoint``, each checked against
what two ranks delivered."""

import json

import numpy as np
import pytest
import yaml
from support import base_config, corpus, take
from tracecheck import assert_step_delivered, deliveries, rank_batches

from fmsdata import build_dataloader
from fmsdata.checkpoint import save_loader_state
from fmsdata.cli.main import main
from fmsdata.util.digest import digest_hex


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A corpus, its config file (global_batch_size gives 2 ranks) and 6 delivered steps."""
    root = tmp_path_factory.mktemp("run")
    info = corpus(root / "data")
    config = base_config(info, global_batch_size=8, return_step_digest=True)
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return info, config, str(path), rank_batches(config, 2, 6)


def trace(capsys, *argv):
    code = main(["trace", *argv])
    out = capsys.readouterr().out
    return code, out


def test_step_as_json_is_what_was_delivered(run, capsys):
    info, _, path, delivered = run
    code, out = trace(capsys, "--config", path, "--step", "4", "--json")
    told = json.loads(out)
    assert code == 0 and told["step"] == 4 and told["world_size"] == 2
    assert_step_delivered(told, delivered[3], info)
    assert set(told["rows"][0]["pieces"][0]) >= {"dataset", "file", "doc", "start", "length"}


def test_step_as_text_names_every_piece(run, capsys):
    _, _, path, _ = run
    code, out = trace(capsys, "--config", path, "--step", "2")
    assert code == 0
    assert out.startswith("step 2: 2 rank(s), 8 rows, told from the run's start")
    assert "rank 1 row 3 (logical shard" in out and "bos (token 1)" in out
    assert " doc " in out and "tokens " in out


def test_doc_finds_the_steps(run, capsys):
    info, _, path, delivered = run
    code, out = trace(
        capsys, "--config", path, "--doc", "a:a/shard_00000.arrow:5", "--until", "6", "--json"
    )
    found = json.loads(out)
    expected = deliveries(delivered, info, "a/shard_00000.arrow", 5)
    assert code == 0 and found["seen"] == expected and found["until"] == 6
    code, out = trace(capsys, "--config", path, "--doc", "a:shard_00000.arrow:5", "--until", "6")
    assert code == 0 and out.startswith("document 5 of a/shard_00000.arrow (dataset a)")


def test_batch_is_saved_and_printed(run, capsys, tmp_path):
    _, _, path, delivered = run
    code, out = trace(capsys, "--config", path, "--step", "3", "--batch", "--out", str(tmp_path))
    assert code == 0 and "[2, 4, 32]" in out
    inputs = np.load(tmp_path / "input_ids.npy")
    labels = np.load(tmp_path / "labels.npy")
    for rank in range(2):
        assert np.array_equal(inputs[rank], delivered[2][rank]["input_ids"].numpy())
        assert np.array_equal(labels[rank], delivered[2][rank]["labels"].numpy())
    code, out = trace(capsys, "--config", path, "--step", "3", "--batch")
    first = " ".join(map(str, delivered[2][0]["input_ids"][0].tolist()))
    assert code == 0 and out.startswith("step 3: input_ids of 2 rank(s) x 4 rows, token ids")
    assert f"rank 0 row 0:\n{first}\n" in out


def test_verify_checks_a_log(run, capsys, tmp_path):
    _, _, path, delivered = run
    lines = [
        {"step": s + 1, "rank": r, "digest": digest_hex(delivered[s][r]["step_digest"])}
        for s in range(6)
        for r in range(2)
    ]
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, out = trace(capsys, "--config", path, "--verify", str(log))
    assert code == 0 and out.startswith("6 logged step(s) match")
    lines[7]["digest"] = "ff" * 8
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, out = trace(capsys, "--config", path, "--verify", str(log))
    assert code == 1 and out.startswith("first difference at step 4: rank 1's batch")


def test_a_checkpoint_folder_is_traced_on(run, capsys, tmp_path):
    info, config, path, delivered = run
    loaders = [build_dataloader(config, rank=r, world_size=2) for r in range(2)]
    for loader in loaders:
        take(loader, 3)
        save_loader_state(loader, tmp_path / "ckpt")
    for step in (2, 5):
        code, out = trace(
            capsys, "--config", path, "--checkpoint", str(tmp_path / "ckpt"), "--step", str(step),
            "--json",
        )  # fmt: skip
        assert code == 0
        assert_step_delivered(json.loads(out), delivered[step - 1], info)


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "give one of --step N"),
        (["--step", "1", "--doc", "a:0:0"], "give one of --step N"),
        (["--doc", "a:0"], "--doc takes DATASET:FILE:DOC"),
        (["--batch", "--doc", "a:0:1"], "--batch tells the tokens of --step N"),
        (["--step", "1", "--out", "x"], "--out is where --batch writes"),
        (["--step", "1", "--until", "3"], "--until bounds the steps --doc looks at"),
    ],
)
def test_usage_errors_say_what_to_give(run, capsys, argv, message):
    _, _, path, _ = run
    assert main(["trace", "--config", path, *argv]) == 2
    assert message in capsys.readouterr().err
