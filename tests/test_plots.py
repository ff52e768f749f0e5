"""``--plot`` of ``inspect`` and ``state show``: the pictures are written, of a readable size
(their pixels are not compared), and a picture that cannot be written fails before work."""

import struct

import pytest
from support import base_config, corpus, rank_loaders, take

from fmsdata.checkpoint import save_loader_state
from fmsdata.cli.main import main

pytest.importorskip("matplotlib", reason='plots need matplotlib (pip install "fmsdata[plot]")')


def png_size(path):
    """(width, height) from a PNG's header; fails unless the file is a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def assert_picture(path):
    width, height = png_size(path)
    assert width >= 1000 and height >= 400
    assert path.stat().st_size > 20_000  # axes, curves and labels, not a blank canvas


def test_inspect_plot_draws_each_dataset(tmp_path, capsys):
    corpus(tmp_path / "data", files={"a": 3, "b": 2})
    target = tmp_path / "lengths.png"
    assert main(["inspect", str(tmp_path / "data"), "--plot", str(target)]) == 0
    assert f"plot written to {target}" in capsys.readouterr().out
    assert_picture(target)


def test_inspect_plot_of_one_file(tmp_path):
    info = corpus(tmp_path / "data")
    shard = next((tmp_path / "data" / "a").rglob("*.arrow"))
    target = tmp_path / "one.png"
    assert main(["inspect", str(shard), "--plot", str(target)]) == 0
    assert_picture(target)
    del info


def test_state_show_plot_draws_shards_and_shares(tmp_path, capsys):
    info = corpus(tmp_path / "data")
    config = base_config(info, logical_shards=4, datasets=["a", "b"], weights=[3, 1])
    for loader in rank_loaders(config, 2):
        take(loader, 10)
        save_loader_state(loader, tmp_path / "ckpt")
    target = tmp_path / "state.png"
    assert main(["state", "show", str(tmp_path / "ckpt"), "--plot", str(target)]) == 0
    assert f"plot written to {target}" in capsys.readouterr().out
    assert_picture(target)


@pytest.mark.parametrize(
    "name, said", [("missing/p.png", "does not exist"), ("p.jpeg", "must end in .png")]
)
def test_a_picture_that_cannot_be_written_fails_first(tmp_path, name, said, capsys):
    corpus(tmp_path / "data")
    assert main(["inspect", str(tmp_path / "data"), "--plot", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert "ConfigError" in err and said in err
