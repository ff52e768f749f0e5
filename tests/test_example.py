"""The FSDP example under torchrun: a checkpoint taken on 2 ranks resumes on 2, 1 and 4
ranks with exactly the global steps of the uninterrupted run (G1-G3 end to end)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from fmsdata.synthetic import write_corpus

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "train_fsdp.py")


def torchrun(ranks, *args, cwd):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(ranks),
        EXAMPLE,
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def hashes(path):
    with open(path) as handle:
        return {row["step"]: row["data_hash"] for row in map(json.loads, handle)}


@pytest.mark.slow
def test_resume_and_rescale_under_torchrun(tmp_path):
    write_corpus(tmp_path / "data", {"a": 4, "b": 4}, docs_per_file=40, mean_length=60)
    common = [
        "--data",
        str(tmp_path / "data"),
        "--logical-shards",
        "8",
        "--global-batch-size",
        "8",
        "--vocab-size",
        "20000",
        "--seq-length",
        "32",
    ]
    torchrun(
        2,
        *common,
        "--steps",
        "10",
        "--ckpt-dir",
        str(tmp_path / "reference"),
        "--hash-log",
        str(tmp_path / "reference.jsonl"),
        cwd=tmp_path,
    )
    torchrun(
        2,
        *common,
        "--steps",
        "4",
        "--ckpt-every",
        "4",
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        "--hash-log",
        str(tmp_path / "first.jsonl"),
        cwd=tmp_path,
    )
    reference = hashes(tmp_path / "reference.jsonl")
    assert sorted(reference) == list(range(1, 11))
    assert hashes(tmp_path / "first.jsonl") == {s: reference[s] for s in range(1, 5)}
    for ranks in (2, 1, 4):
        ckpt = tmp_path / f"ckpt_{ranks}"
        shutil.copytree(tmp_path / "ckpt", ckpt)
        out = torchrun(
            ranks,
            *common,
            "--steps",
            "10",
            "--ckpt-dir",
            str(ckpt),
            "--resume",
            "--hash-log",
            str(tmp_path / f"resumed_{ranks}.jsonl"),
            cwd=tmp_path,
        )
        assert f"resumed at step 4 on {ranks} rank(s)" in out
        assert hashes(tmp_path / f"resumed_{ranks}.jsonl") == {
            s: reference[s] for s in range(5, 11)
        }


def test_custom_format_example_matches_arrow_and_resumes(tmp_path):
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "custom_format.py")
    done = subprocess.run(
        [sys.executable, example, "--dir", str(tmp_path), "--batches", "12"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "same batches as the Arrow original: True" in done.stdout
    assert "resumed run continues exactly: True" in done.stdout


def test_custom_stage_example_trains_resumes_and_rescales(tmp_path):
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "custom_stage.py")
    done = subprocess.run(
        [sys.executable, example, "--dir", str(tmp_path), "--steps", "10"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resumed run continues exactly: True" in done.stdout
    assert "two ranks rescaled to one continue exactly: True" in done.stdout
