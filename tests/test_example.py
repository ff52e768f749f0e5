"""The FSDP example under torchrun: a checkpoint taken on 2 ranks resumes on 2, 1 and 4
ranks with exactly the global steps of the uninterrupted run (G1-G3 end to end)."""

import glob
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
from support import run_torchrun

from fmsdata.data.synthetic import write_corpus

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "train_fsdp.py")


def torchrun(ranks, *args, cwd):
    return run_torchrun(EXAMPLE, ranks, args, cwd, timeout=600)


def hashes(path):
    with open(path) as handle:
        return {row["step"]: row["data_hash"] for row in map(json.loads, handle)}


def losses(path):
    with open(path) as handle:
        return {row["step"]: row["loss"] for row in map(json.loads, handle)}


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
        "--bos-token",
        "1",
        "--eos-token",
        "2",
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
    reference_losses = losses(tmp_path / "reference.jsonl")
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
        # The logged loss is the mean over every rank's tokens: the same global step gives
        # the same figure on any world size (up to the order of floating-point sums).
        resumed = losses(tmp_path / f"resumed_{ranks}.jsonl")
        assert resumed[5] == pytest.approx(reference_losses[5], rel=1e-4)
        assert resumed == pytest.approx({s: reference_losses[s] for s in range(5, 11)}, rel=1e-2)


def run_example(name, *args):
    """``examples/<name>`` run in a subprocess; its stdout (fails with its output)."""
    example = os.path.join(os.path.dirname(__file__), "..", "examples", name)
    done = subprocess.run(
        [sys.executable, example, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow  # the example end to end in subprocesses
def test_custom_format_example_matches_arrow_and_resumes(tmp_path):
    done = run_example("custom_format.py", "--dir", str(tmp_path), "--batches", "12")
    assert "same batches as the Arrow original: True" in done.stdout
    assert "not a multiple of logical_shards" not in done.stderr  # it follows the advice
    assert "resumed run continues exactly: True" in done.stdout


@pytest.mark.slow  # the example end to end in subprocesses
def test_custom_stage_example_trains_resumes_and_rescales(tmp_path):
    done = run_example("custom_stage.py", "--dir", str(tmp_path), "--steps", "10")
    assert "resumed run continues exactly: True" in done.stdout
    assert "two ranks rescaled to one continue exactly: True" in done.stdout


def load_example():
    spec = importlib.util.spec_from_file_location("train_fsdp_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_example_trains_on_the_demo_data_with_its_tokens(tmp_path):
    """The README's path: demo output -> the example, no token ids given by hand."""
    from fmsdata.cli.demo import write_raw
    from fmsdata.tokenize import TokenizeSpec, run_tokenize
    from fmsdata.util.textcorpus import bundled_tokenizer_path

    write_raw(str(tmp_path / "raw"))
    spec = TokenizeSpec(str(tmp_path / "tokens"), "stdlib", bundled_tokenizer_path())
    run_tokenize(spec, [str(tmp_path / "raw")])
    out = torchrun(
        1,
        "--data",
        str(tmp_path / "tokens"),
        "--steps",
        "2",
        "--seq-length",
        "32",
        "--hash-log",
        str(tmp_path / "log.jsonl"),
        cwd=tmp_path,
    )
    assert "bos_token 0, eos_token 1, vocab_size 4096" in out
    assert sorted(hashes(tmp_path / "log.jsonl")) == [1, 2]


def test_documented_training_commands_write_the_hash_log():
    """Every command line in the README and the docs that runs the example logs hashes."""
    top = os.path.join(os.path.dirname(__file__), "..")
    pages = [os.path.join(top, "README.md")] + glob.glob(
        os.path.join(top, "docs", "**", "*.md"), recursive=True
    )
    commands = []
    for page in pages:
        with open(page, encoding="utf-8") as handle:
            commands += [
                line
                for line in handle
                if "examples/train_fsdp.py" in line
                and line.lstrip().startswith(("torchrun", "python"))
            ]
    assert commands
    for command in commands:
        assert "--hash-log" in command, command


def test_resume_without_a_checkpoint_is_a_warning(tmp_path, caplog):
    """--resume that finds nothing starts at step 0, and says so at WARNING; a checkpoint
    found is named at INFO with its step."""
    example = load_example()
    with caplog.at_level(logging.INFO, logger="train_fsdp"):
        assert example.resume_step(str(tmp_path / "ckpt")) == 0
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "holds no checkpoint" in warning.getMessage()
    assert str(tmp_path / "ckpt") in warning.getMessage()
    caplog.clear()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest").write_text("12")
    with caplog.at_level(logging.INFO, logger="train_fsdp"):
        assert example.resume_step(str(tmp_path / "ckpt")) == 12
    assert f"resuming from {tmp_path / 'ckpt' / 'step_000012'} (step 12)" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.slow  # the example end to end in subprocesses
def test_custom_order_example_resumes_rescales_and_is_fingerprinted(tmp_path):
    done = run_example("custom_order.py", "--dir", str(tmp_path), "--steps", "10")
    for claim in (
        "each file's documents come in stored order: True",
        "resumed run continues exactly: True",
        "two ranks rescaled to one continue exactly: True",
        "a state saved with the default order is refused: True",
    ):
        assert claim in done.stdout


@pytest.mark.slow  # the example end to end in a subprocess
def test_mixing_feedback_example_moves_the_weights_and_resumes(tmp_path):
    done = run_example("mixing_feedback.py", "--dir", str(tmp_path))
    for claim in (
        "the hard dataset's weight rose: True",
        "the tokens delivered follow the weights: True",
        "resumed run continues exactly: True",
    ):
        assert claim in done.stdout
