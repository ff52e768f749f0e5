import numpy as np
import pytest
from support import corpus

from fmsdata.cli.main import main
from fmsdata.data.catalog import discover, read_counts
from fmsdata.errors import ShardFormatError
from fmsdata.handlers import ArrowDocHandler


def test_discovery_finds_nested_shards_in_sorted_order(tmp_path):
    info = corpus(tmp_path, {"a": 4, "b": 1}, nested=True)
    (tmp_path / "a" / "notes.txt").write_text("not a shard")
    catalog = discover(str(tmp_path), None, ArrowDocHandler())
    assert [d.name for d in catalog.datasets] == ["a", "b"]
    assert list(catalog.datasets[0].paths) == sorted(p for p in info.files if p.startswith("a/"))
    assert "a/part/shard_00001.arrow" in catalog.datasets[0].paths
    assert (catalog.datasets[0].docs == -1).all()


def test_fingerprint_changes_with_the_files(tmp_path):
    corpus(tmp_path)
    before = discover(str(tmp_path), None, ArrowDocHandler()).fingerprint()
    assert discover(str(tmp_path), None, ArrowDocHandler()).fingerprint() == before
    (tmp_path / "b" / "shard_00000.arrow").write_bytes(b"x")
    assert discover(str(tmp_path), None, ArrowDocHandler()).fingerprint() != before


def test_index_command_writes_bamba_counts(tmp_path, capsys):
    info = corpus(tmp_path, nested=True)
    assert main(["index", str(tmp_path), "--workers", "2"]) == 0
    text = (tmp_path / "meta" / "counts.csv").read_text().splitlines()
    assert text[0] == "dataset/filename,documents,tokens"
    assert all(line.startswith("/") for line in text[1:])
    counts = read_counts(str(tmp_path), ["a", "b"])
    assert set(counts) == set(info.files)
    for rel, (firsts, lengths) in info.files.items():
        assert counts[rel] == (len(firsts), int(lengths.sum()))
    catalog = discover(str(tmp_path), None, ArrowDocHandler())
    assert (catalog.datasets[0].docs > 0).all()
    assert "documents" in capsys.readouterr().out


def test_counts_with_a_root_prefix_are_matched(tmp_path):
    corpus(tmp_path, {"a": 1})
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "combined_counts.csv").write_text(
        "dataset/filename,documents,tokens\n/release/a/shard_00000.arrow,24,999\n"
    )
    catalog = discover(str(tmp_path), None, ArrowDocHandler())
    assert catalog.datasets[0].docs.tolist() == [24]


def test_bad_counts_file_names_it(tmp_path):
    corpus(tmp_path, {"a": 1})
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "counts.csv").write_text("path,n\nx,1\n")
    with pytest.raises(ShardFormatError, match="counts.csv: counts header"):
        discover(str(tmp_path), None, ArrowDocHandler())


@pytest.mark.parametrize("recorded", [30, 20])
def test_stale_counts_are_detected(tmp_path, recorded):
    """A file with fewer documents than recorded lost some: re-indexing would record the
    damage as valid, so the advice is to restore it; more than recorded is a change."""
    from support import base_config, take

    from fmsdata import build_dataloader

    info = corpus(tmp_path, {"a": 1})
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "counts.csv").write_text(
        f"dataset/filename,documents,tokens\n/a/shard_00000.arrow,{recorded},999\n"
    )
    loader = build_dataloader(base_config(info, datasets=None, weights=None, logical_shards=1))
    with pytest.raises(ShardFormatError) as caught:
        take(loader, 1)
    message = str(caught.value)
    assert f"holds 24 documents but the counts metadata (meta/) records {recorded}" in message
    if recorded > 24:
        assert "lost 6 since it was indexed (cut short or damaged); restore it" in message
        assert "run `fmsdata index`" not in message
    else:
        assert "changed since it was indexed" in message and "run `fmsdata index`" in message


def test_counts_let_the_loader_skip_opening_files(tmp_path, monkeypatch):
    from support import base_config, take

    from fmsdata import build_dataloader

    info = corpus(tmp_path, {"a": 8}, docs_per_file=10)
    assert main(["index", str(tmp_path)]) == 0
    opened = []
    original = ArrowDocHandler.open

    def spy(self, path):
        opened.append(path)
        return original(self, path)

    monkeypatch.setattr(ArrowDocHandler, "open", spy)
    loader = build_dataloader(
        base_config(info, datasets=None, weights=None, logical_shards=8, batch_size=1)
    )
    take(loader, 1)
    # One shard (of eight) emitted a line: it opened its own file only.
    assert len(set(opened)) == 1
    assert np.all(discover(str(tmp_path), None, ArrowDocHandler()).datasets[0].docs == 10)
