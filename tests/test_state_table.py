"""``fmsdata state show``'s tables: every column labelled with what it counts and its unit,
numbers right-aligned under their labels, what a chain does not hold named rather than
shown as zeros; ``--json`` keeps its keys (scripts read them)."""

import json

import pytest
from support import base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.cli.main import main
from fmsdata.cli.statetable import Column, dataset_table, render, shard_table
from fmsdata.state.file import save_state


def right_edges(line, values):
    """Where each of ``values`` ends in ``line``, found left to right."""
    edges, at = [], 0
    for value in values:
        at = line.index(value, at) + len(value)
        edges.append(at)
    return edges


def test_numbers_end_under_their_labels_and_groups_span_their_columns():
    columns = [
        Column("", "name", lambda r: r["n"], number=False),
        Column("counted", "docs", lambda r: f"{r['d']:,}"),
        Column("counted", "tokens", lambda r: f"{r['t']:,}"),
        Column("a long group label", "x", lambda r: str(r["x"])),
    ]
    rows = [
        {"n": "web", "d": 3, "t": 1234567, "x": 1},
        {"n": "a-longer-name", "d": 0, "t": 5, "x": 22},
    ]
    top, labels, *lines = render(columns, rows)
    ends = right_edges(labels, ["name", "docs", "tokens", "x"])
    for line, row in zip(lines, rows):
        assert line.startswith(row["n"])
        cells = [f"{row['d']:,}", f"{row['t']:,}", str(row["x"])]
        assert right_edges(line, cells) == ends[1:], (line, labels)
    assert "counted" in top and "a long group label" in top
    # A group label sits over its own columns, never over its neighbours'.
    start = top.index("counted")
    assert ends[0] < start and start + len("counted") <= ends[2]
    assert top.index("a long group label") > ends[2]


def summary_of(loader):
    from fmsdata.cli.state import summarize

    return summarize([loader.snapshot()])


@pytest.fixture(scope="module")
def loader(tmp_path_factory):
    info = corpus(tmp_path_factory.mktemp("table") / "data")
    loader = build_dataloader(base_config(info))
    take(loader, 5)
    return loader


def test_the_dataset_table_shows_what_the_chain_holds_and_names_what_it_does_not(loader):
    summary = summary_of(loader)
    top, labels, *rest = dataset_table(summary["datasets"])
    assert labels.split() == ["dataset", "docs", "tokens", "docs", "tokens", "tokens", "done"]
    for group in ("delivered", "in shuffle buffer", "unsent", "epochs"):
        assert group in top
    for name, totals in summary["datasets"].items():
        row = next(line.split() for line in rest if line.startswith(name + " "))
        expected = [totals[k] for k in ("docs", "tokens", "buffered_docs", "buffered_tokens")]
        assert row[1:5] == [f"{v:,}" for v in expected]
    legend = "\n".join(rest)
    assert "none in this state (no column): lines held by stages of your own" in legend
    # Once a dataset has some, the column is there (and named in the legend).
    datasets = {n: {**t, "skipped_docs": 2} for n, t in summary["datasets"].items()}
    top, labels, *rest = dataset_table(datasets)
    assert "too short" in top and "too short: documents under min_length" in "\n".join(rest)


def test_the_shard_table_names_each_shard_once_and_its_lines_in_flight(loader):
    summary = summary_of(loader)
    shards = [dict(s) for s in summary["shards"]]
    shards[0]["advance"] = 3
    top, labels, *lines = shard_table(shards)
    assert labels.split() == [
        "shard",
        "dataset",
        "epoch",
        "docs",
        "read",
        "docs",
        "tokens",
        "tokens",
    ]
    assert "this epoch" in top and "delivered" in top and "in shuffle buffer" in top
    names = len(summary["datasets"])
    assert lines[names].strip().startswith("+3 line(s) emitted after this recorded position")
    first = [line for line in lines if not line.strip().startswith("+")]
    assert len(first) == len(shards) * names
    shard_ids = [line[:5].strip() for line in first]
    assert shard_ids == [str(s["id"]) if i == 0 else "" for s in shards for i in range(names)]
    for line, (shard, name) in zip(first, [(s, n) for s in shards for n in s["datasets"]]):
        info = shard["datasets"][name]
        assert f"{info['pos']:,} of {info['size']:,}" in line


def test_json_keeps_its_keys(loader, tmp_path, capsys):
    save_state(str(tmp_path / "state.fms"), loader.snapshot())
    assert main(["state", "show", str(tmp_path / "state.fms"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) == {
        "path", "source", "stage_counts", "stage_ratios", "version", "world_size", "steps", "skips",
        "skipped_lines", "logical_shards", "weights", "weight_schedule", "global_batch_size",
        "lines", "uncounted_lines", "unknown_stages", "left_out", "datasets", "shards",
        "saved_version", "mix_policy", "mix_history",
    }  # fmt: skip
    assert got["source"] is None  # fmsdata's own state file
    dataset = next(iter(got["datasets"].values()))
    assert {"docs", "tokens", "buffered_docs", "buffered_tokens", "unsent_tokens",
            "held_tokens", "dropped_docs", "dropped_tokens", "skipped_docs",
            "epochs_done", "delivered_tokens", "taken_tokens"} <= set(dataset)  # fmt: skip
    assert set(got["shards"][0]) == {"id", "advance", "datasets"}
    assert set(next(iter(got["shards"][0]["datasets"].values()))) == {
        "epoch", "pos", "size", "docs", "skipped", "tokens", "buffered_docs",
        "buffered_tokens", "unsent_tokens", "held_tokens", "dropped_docs", "dropped_tokens",
        "epochs_done",
    }  # fmt: skip
