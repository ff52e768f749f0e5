"""A missing optional package, an unknown URL protocol or a config file of the wrong shape
ends in a typed error that says what is wrong and what fixes it, from the library and from
the command line alike (never a raw fsspec or import traceback)."""

import sys

import pytest
import yaml
from support import base_config, corpus

from fmsdata import build_dataloader
from fmsdata.cli.main import main
from fmsdata.errors import ConfigError, MissingDependencyError
from fmsdata.util.extras import missing

BASE = {"seq_length": 8, "batch_size": 2, "logical_shards": 2, "eos_token": 1}


def without(monkeypatch, package, protocols=()):
    """Make ``package`` unimportable here, and forget fsspec classes already loaded from it."""
    monkeypatch.setitem(sys.modules, package, None)
    for protocol in protocols:
        monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, protocol, raising=False)


@pytest.mark.parametrize(
    "url, package, protocols, fix",
    [
        ("s3://bucket/data", "s3fs", ("s3", "s3a"), 'pip install "fmsdata[s3]"'),
        ("gs://bucket/data", "gcsfs", ("gs", "gcs"), 'pip install "fmsdata[gcs]"'),
        ("abfs://container/data", "adlfs", ("abfs",), "pip install adlfs"),
    ],
)
def test_a_missing_filesystem_package_names_the_install_command(
    url, package, protocols, fix, monkeypatch, capsys
):
    without(monkeypatch, package, protocols)
    with pytest.raises(MissingDependencyError) as caught:
        build_dataloader({"data_path": url, **BASE})
    message = str(caught.value)
    assert package in message and fix in message and url in message
    assert "not installed" in message
    assert isinstance(caught.value, ImportError)  # also caught by `except ImportError`

    for argv in (["inspect", url], ["index", url], ["download", url, "dest", "--dry-run"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "MissingDependencyError" in err and fix in err, argv
        assert "Traceback" not in err


def test_a_broken_install_is_told_apart_from_a_missing_one():
    message = str(missing("pytest", "running tests", ImportError("libfoo.so: no such file")))
    assert "installed but fails to import" in message and "libfoo.so" in message
    assert "reinstall it with: pip install pytest" in message


def test_an_unknown_protocol_is_a_config_error_with_the_close_match(capsys):
    with pytest.raises(ConfigError) as caught:
        build_dataloader({"data_path": "htp://example.com/data", **BASE})
    message = str(caught.value)
    assert "unknown URL protocol 'htp'" in message and "did you mean http://" in message
    with pytest.raises(SystemExit) as stop:  # a usage error, caught as the command line parses
        main(["inspect", "htp://example.com/data"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "argument path: 'htp://example.com/data': unknown URL protocol 'htp'" in err


def test_compressed_text_without_zstandard(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "data" / "web"
    folder.mkdir(parents=True)
    (folder / "part.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd")  # never decompressed
    without(monkeypatch, "zstandard")
    argv = ["inspect", str(folder / "part.jsonl.zst"), "--tokenizer", "stdlib-bpe-4k"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "zstandard" in err and 'pip install "fmsdata[text]"' in err and "part.jsonl.zst" in err
    config = {
        "data_path": str(tmp_path / "data"),
        "file_type": "jsonl",
        "tokenizer": "stdlib-bpe-4k",
        "cache_dir": str(tmp_path / "cache"),
        "num_workers": 0,
        **BASE,
    }
    with pytest.raises(MissingDependencyError, match=r'pip install "fmsdata\[text\]"'):
        next(iter(build_dataloader(config)))


def test_ray_backend_without_ray(tmp_path, monkeypatch, capsys):
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    without(monkeypatch, "ray")
    argv = ["tokenize", str(tmp_path / "in.jsonl"), "--tokenizer", "stdlib-bpe-4k"]
    argv += ["--output-dir", str(tmp_path / "out"), "--backend", "ray"]
    assert main(argv) == 2
    assert 'pip install "fmsdata[ray]"' in capsys.readouterr().err


def test_plotting_without_matplotlib_says_what_to_install(tmp_path, monkeypatch, capsys):
    info = corpus(tmp_path / "data")
    without(monkeypatch, "matplotlib")
    assert main(["inspect", str(tmp_path / "data"), "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "--plot needs the matplotlib package" in err and 'pip install "fmsdata[plot]"' in err
    assert not (tmp_path / "p.png").exists()
    del info


@pytest.mark.parametrize(
    "text, shown",
    [("- data_path: /d\n- seq_length: 8\n", "a list"), ("[1, 2]\n", "a list"), ("7\n", "an int")],
)
def test_a_config_file_that_is_not_a_mapping(tmp_path, text, shown, capsys):
    path = tmp_path / "loader.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        build_dataloader(str(path))
    assert f"holds {shown} at its top level" in str(caught.value)
    assert main(["bench", str(path)]) == 2
    err = capsys.readouterr().err
    assert "ConfigError" in err and str(path) in err and "mapping of field: value" in err


def test_a_mapping_config_file_still_loads(tmp_path):
    info = corpus(tmp_path / "data")
    path = tmp_path / "loader.yaml"
    path.write_text(yaml.safe_dump({"data": base_config(info)}))
    assert next(iter(build_dataloader(str(path))))["input_ids"].shape[0] > 0
