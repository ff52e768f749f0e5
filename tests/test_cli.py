import json
import re
import subprocess
import sys
import time

import pytest
import torch
import yaml
from support import base_config, corpus

from fmsdata.cli.main import main
from fmsdata.errors import ShardFormatError
from fmsdata.stages.savedchain import stage_state


def test_every_command_has_help():
    for command in ("demo", "index", "bench", "warm", "state"):
        out = subprocess.run(
            [sys.executable, "-m", "fmsdata.cli.main", command, "--help"],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0 and "usage:" in out.stdout


def test_demo_runs_and_resumes_exactly(tmp_path, capsys):
    assert main(["demo", "--dir", str(tmp_path), "--batches", "40", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "matches the uninterrupted one (20 batches compared)" in out


def test_demo_reruns_in_its_folder_and_says_what_next(tmp_path, capsys):
    """A second run in the same --dir reuses its raw files (same bytes, same mtimes) and
    tokenized shards; the last lines point at a loader config with the data's own BOS/EOS
    and at the commands that use it."""
    import os

    from fmsdata import build_dataloader
    from fmsdata.data.metadata import read_metadata, special_token_ids

    argv = ["demo", "--dir", str(tmp_path), "--batches", "4", "--workers", "1"]
    assert main(argv) == 0
    raw = sorted((tmp_path / "raw").iterdir())
    stamps = {p.name: os.stat(p).st_mtime_ns for p in raw}
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert {p.name: os.stat(p).st_mtime_ns for p in raw} == stamps
    assert "4 of them already there" in out and "matches the uninterrupted one" in out

    lines = out.rstrip().splitlines()
    start = lines.index("next:")
    steps = "\n".join(lines[start:])
    config_path = tmp_path / "loader.yaml"
    assert str(config_path) in steps and f"fmsdata bench {config_path}" in steps
    assert "examples/train_fsdp.py --data" in steps and "--hash-log" in steps
    config = yaml.safe_load(config_path.read_text())
    tokens = special_token_ids(read_metadata(str(tmp_path / "tokens")))
    assert (config["bos_token"], config["eos_token"]) == (tokens["bos"], tokens["eos"]) == (0, 1)
    assert config["data_path"] == str(tmp_path / "tokens")
    batch = next(iter(build_dataloader(str(config_path))))
    assert batch["input_ids"].shape == (config["batch_size"], config["seq_length"])


def test_demo_prints_absolute_paths_for_a_relative_dir(tmp_path, monkeypatch, capsys):
    """``--dir X`` relative: every path printed still works from any folder."""
    import os
    import shlex

    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--dir", "work", "--batches", "2", "--workers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    steps = lines[lines.index("next:") :]
    (command,) = [line for line in steps if "torchrun" in line]
    words = shlex.split(command)
    example = words[words.index("--nproc_per_node") + 2]
    assert os.path.isabs(example) and os.path.isfile(example)
    for flag in ("--data", "--ckpt-dir", "--hash-log"):
        path = words[words.index(flag) + 1]
        assert path.startswith(str(tmp_path / "work")), (flag, path)
    assert "from any folder" in "\n".join(steps)
    assert f"fmsdata bench {tmp_path / 'work' / 'loader.yaml'}" in "\n".join(steps)


def test_bench_reports_figures_and_what_it_timed(tmp_path, capsys):
    info = corpus(tmp_path / "data")
    config = base_config(info, shuffle_window=6, logical_shards=4, batch_size=3)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = ["bench", str(path), "--batches", "5", "--seconds", "0", "--warmup", "2"]
    assert main([*argv, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["fill_batches"] == 8  # 4 shards x 6 lines / 3 rows a batch
    assert figures["warmup_batches"] == 8 + 2
    assert figures["timed_batches"] == 5
    assert figures["timed_tokens"] == 5 * 3 * config["seq_length"]
    assert figures["tokens_per_s"] == pytest.approx(figures["timed_tokens"] / figures["timed_s"])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "10 batches untimed: the first, 8 while the shuffle buffers fill (4 logical" in out
    assert "then --warmup 2" in out
    assert f"timed           5 batches, {5 * 3 * config['seq_length'] / 1e6:.1f} M tokens" in out


def test_bench_times_a_window_of_at_least_the_batches_and_seconds_after_the_fill():
    """The first batch, the fill and --warmup are untimed; the window then runs until both
    its batches and its seconds are reached (a fake loader counts the batches asked)."""
    import types

    from fmsdata.cli.bench import measure

    class Loader:
        config = types.SimpleNamespace(shuffle_window=10, batch_size=4, num_workers=0)
        dataset = types.SimpleNamespace(shard_ids=[0, 1])
        taken = 0

        def __iter__(self):
            while True:
                Loader.taken += 1
                time.sleep(0.002)
                yield {"input_ids": torch.zeros(4, 8)}

        def snapshot(self):
            return {"version": 1}

        def load_state_dict(self, state):
            pass

        def remote_calls(self):
            return {"GET": 0, "bytes": 0}

    figures = measure(Loader(), warmup=3, batches=2, seconds=0.05)
    assert figures["fill_batches"] == 5 and figures["warmup_batches"] == 1 + 4 + 3
    assert figures["timed_s"] >= 0.05 and figures["timed_batches"] > 2
    assert Loader.taken == figures["warmup_batches"] + figures["timed_batches"]
    assert figures["timed_tokens"] == figures["timed_batches"] * 32


def test_bench_ranks_worker_counts_by_steady_throughput(tmp_path, capsys):
    from fmsdata.cli.bench import ranking

    table = ranking(
        [
            {"num_workers": 0, "tokens_per_s": 10e6},
            {"num_workers": 1, "tokens_per_s": 20e6},
            {"num_workers": 2, "tokens_per_s": 19.5e6},
        ]
    )
    rows = table.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["1", "2", "0"]
    assert "(even with the fastest)" in rows[1] and "even" not in rows[2]
    info = corpus(tmp_path / "data")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base_config(info)))
    argv = ["bench", str(path), "--batches", "3", "--seconds", "0", "--workers", "0,1"]
    assert main([*argv, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert [f["num_workers"] for f in figures] == [0, 1]
    assert main(argv) == 0
    assert "steady throughput by num_workers, fastest first:" in capsys.readouterr().out


def test_errors_exit_with_a_message(tmp_path, capsys):
    assert main(["index", str(tmp_path / "missing")]) == 2
    assert "ConfigError" in capsys.readouterr().err


def test_state_show_reads_every_kind_of_checkpoint(tmp_path, capsys):
    import json

    import torch.distributed.checkpoint as dcp
    from support import rank_loaders, take

    from fmsdata import build_dataloader
    from fmsdata.checkpoint import save_loader_state

    info = corpus(tmp_path / "data")
    config = base_config(info, logical_shards=4)
    for loader in rank_loaders(config, 2):
        take(loader, 12)
        save_loader_state(loader, tmp_path / "ckpt")
    assert main(["state", "show", str(tmp_path / "ckpt")]) == 0
    text = capsys.readouterr().out
    assert "saved by 2 rank(s) at step 12, 4 logical shards" in text
    # Each logical shard's row names it once, its datasets on the lines under it.
    for sid in range(4):
        assert re.search(rf"^ *{sid}  a .*\n {{5}}  b ", text, re.M), (sid, text)

    loader = build_dataloader(config)
    take(loader, 5)
    loader.skip(2)
    dcp.save({"dataloader": loader}, checkpoint_id=str(tmp_path / "dcp"))
    assert main(["state", "show", str(tmp_path / "dcp"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 7 and summary["skips"] == [[5, 2]] and summary["world_size"] == 1
    snapshot = loader.snapshot(settle=True)
    fingerprint = snapshot["fingerprint"]
    tokens = sum(
        stage_state(e["state"], fingerprint, "mixer")["tokens"]["a"] for e in snapshot["shards"]
    )
    assert (
        summary["datasets"]["a"]["tokens"] <= tokens
    )  # saved at an item boundary, plus lines after
    assert {row["id"] for row in summary["shards"]} == {0, 1, 2, 3}

    auto = {**config, "checkpoint_dir": str(tmp_path / "auto"), "checkpoint_every": 4}
    loader = build_dataloader(auto)
    take(loader, 9)
    loader.checkpointer.wait()
    assert main(["state", "show", str(tmp_path / "auto")]) == 0
    assert "step_000000008" in capsys.readouterr().out


def test_a_damaged_shard_through_bench_is_one_line_naming_the_file(tmp_path):
    """With workers, ``fmsdata bench`` on a cut shard prints the cause in one line (type
    and message naming the file) and exits non-zero; ``--debug`` shows the traceback,
    the worker's included."""
    info = corpus(tmp_path / "data")
    victim = tmp_path / "data" / "b" / "shard_00000.arrow"
    victim.write_bytes(victim.read_bytes()[:-40])
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base_config(info, logical_shards=2, num_workers=2)))
    command = [sys.executable, "-m", "fmsdata.cli.main", "bench", str(path), "--batches", "50"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"fmsdata bench: ShardFormatError: {victim}: ")
    # --debug lets the error through (Python prints its traceback), the worker's with it;
    # in this process, which saves starting another.
    with pytest.raises(ShardFormatError, match=str(victim)) as raised:
        main(["--debug", "bench", str(path), "--batches", "50"])
    assert any("Raised in DataLoader worker process" in n for n in raised.value.__notes__)


def test_inspect_checks_files_against_the_recorded_counts(tmp_path, capsys):
    """A shard holding fewer documents than meta/counts.csv records is said, naming the
    file and both counts, and the exit code is non-zero; from the root, a dataset folder
    or the file itself."""
    corpus(tmp_path, {"a": 2}, docs_per_file=24)
    assert main(["index", str(tmp_path)]) == 0
    counts = tmp_path / "meta" / "counts.csv"
    counts.write_text(
        counts.read_text().replace("a/shard_00001.arrow,24,", "a/shard_00001.arrow,30,")
    )
    capsys.readouterr()
    for path in (tmp_path, tmp_path / "a", tmp_path / "a" / "shard_00001.arrow"):
        assert main(["inspect", str(path), "--samples", "0"]) == 1
        err = capsys.readouterr().err
        assert "shard_00001.arrow: holds 24 documents but the counts metadata" in err
        assert "records 30" in err and "shard_00000" not in err
