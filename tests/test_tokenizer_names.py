"""``--tokenizer`` / ``tokenizer:`` take the bundled tokenizer by name wherever a
tokenizer is asked for: tokenize, inspect, index and the loader config."""

import json
import os

import pytest

from fmsdata import build_dataloader
from fmsdata.cli.main import main
from fmsdata.errors import ConfigError
from fmsdata.handlers.text import TextTokenizer
from fmsdata.util.textcorpus import bundled_tokenizer_path, resolve_tokenizer

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Return the number of items."]


def test_names_resolve_to_the_bundled_file(tmp_path, monkeypatch):
    path = bundled_tokenizer_path()
    assert os.path.isfile(path)
    assert resolve_tokenizer("stdlib-bpe-4k") == resolve_tokenizer("stdlib-bpe-4k.json") == path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stdlib-bpe-4k.json").write_text("{}")  # a file of that name wins
    assert resolve_tokenizer("stdlib-bpe-4k.json") == "stdlib-bpe-4k.json"
    assert resolve_tokenizer("no-such-tokenizer") == "no-such-tokenizer"
    with pytest.raises(ConfigError, match="or the name of a bundled one: stdlib-bpe-4k"):
        TextTokenizer("no-such-tokenizer")


def test_every_command_takes_the_name(tmp_path, capsys):
    raw = tmp_path / "in.jsonl"
    raw.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    out = tmp_path / "out"
    argv = ["tokenize", str(raw), "--tokenizer", "stdlib-bpe-4k", "--output-dir", str(out)]
    assert main(argv) == 0
    assert main(["index", str(out)]) == 0
    capsys.readouterr()
    shard = next((out / "default").rglob("*.arrow"))
    assert main(["inspect", str(shard), "--tokenizer", "stdlib-bpe-4k", "--samples", "2"]) == 0
    shown = capsys.readouterr().out
    assert all(text in shown for text in TEXTS)
    assert main(["inspect", str(raw), "--tokenizer", "stdlib-bpe-4k"]) == 0
    assert "2 documents" in capsys.readouterr().out.replace(",", "")


def test_the_loader_config_takes_the_name(tmp_path):
    folder = tmp_path / "data" / "web"
    folder.mkdir(parents=True)
    lines = "".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 4)
    (folder / "part.jsonl").write_text(lines)
    config = {
        "data_path": str(tmp_path / "data"),
        "file_type": "jsonl",
        "tokenizer": "stdlib-bpe-4k",
        "cache_dir": str(tmp_path / "cache"),
        "seq_length": 16,
        "batch_size": 2,
        "logical_shards": 1,
        "bos_token": 0,
        "eos_token": 1,
        "num_workers": 0,
    }
    batch = next(iter(build_dataloader(config)))
    assert batch["input_ids"].shape == (2, 16)
