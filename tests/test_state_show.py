"""``fmsdata state show`` counts what the loader delivered, for any chain (G10, issue 23).

The truth is counted independently of the state: from the token values of the batches
(each corpus token value names its dataset, file, document and position). The counts
come from the stages' own reports (``fmsdata.state.report``), so a chain without a shuffle
buffer, a user's stage holding lines and skips are counted exactly once the lines in
flight are replayed (``snapshot(settle=True)``, what ``state show --config`` reads).
"""

import json

import pytest
from support import base_config, check_resume, corpus, delivered_truth, roundtrip, take
from test_user_stages import SwapPairs

from fmsdata import build_dataloader
from fmsdata.cli.main import main
from fmsdata.cli.state import summarize
from fmsdata.stages import DocumentFilter
from fmsdata.stages.shard import default_stages
from fmsdata.state.file import save_state


def pack_only(shard):
    """No shuffle buffer: lines leave the packer in order."""
    return shard.pack(shard.documents())


def swapped(shard):
    """A user's stage that holds one line between two calls, over the packer."""
    return SwapPairs(shard.pack(shard.documents()))


def one_stream(shard):
    """The packer reading one dataset's stream directly: no mixer."""
    return shard.shuffle(shard.pack(shard.streams()[0]))


def drop_every_third(tokens, document_id):
    return int(document_id) % 3 != 0


def filtered_pack_only(shard):
    """A filter over the packer: split documents' pieces reach it in order."""
    return DocumentFilter(pack_only(shard), drop_every_third)


def filtered(shard):
    """A filter over the default chain: the shuffle buffer reorders split documents' pieces."""
    return DocumentFilter(default_stages(shard), drop_every_third)


def shown(summary):
    return {
        name: {"tokens": d["tokens"], "docs": d["docs"]} for name, d in summary["datasets"].items()
    }


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("show") / "data", docs_per_file=100)


@pytest.mark.parametrize(
    "stages", [pack_only, swapped, one_stream], ids=["no-shuffle", "user-stage", "no-mixer"]
)
@pytest.mark.parametrize("workers", [0, 1])
def test_counts_equal_what_was_delivered_for_any_chain(info, stages, workers):
    config = base_config(info, num_workers=workers, bos_token=None, eos_token=None)
    loader = build_dataloader(config, stages=stages)
    batches = take(loader, 11)
    summary = summarize([roundtrip(loader.snapshot(settle=True))])
    assert summary["lines"] == 11 * config["batch_size"]
    assert summary["left_out"] is None
    assert shown(summary) == delivered_truth(info, config, batches)
    if stages is swapped:  # SwapPairs holds a line: its tokens are counted as held
        assert sum(d["held_tokens"] for d in summary["datasets"].values()) > 0
    if stages is one_stream:  # the packer takes any document source, and resumes exactly
        assert summary["datasets"]["b"]["tokens"] == 0 < summary["datasets"]["a"]["tokens"]
        check_resume(lambda: build_dataloader(config, stages=stages), 8, (3,))


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("stages", [filtered_pack_only, filtered], ids=["no-shuffle", "default"])
def test_counts_leave_out_what_a_filter_dropped_per_dataset(
    info, tmp_path, capsys, stages, workers
):
    """Delivered per dataset is what the batches hold: a DocumentFilter's drops are
    subtracted from the dataset of each dropped document (text and JSON)."""
    config = base_config(info, num_workers=workers, bos_token=None, eos_token=None)
    loader = build_dataloader(config, stages=stages)
    batches = take(loader, 11)
    truth = delivered_truth(info, config, batches)
    save_state(str(tmp_path / "state.fms"), loader.snapshot(settle=True))
    assert main(["state", "show", str(tmp_path / "state.fms"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["left_out"] is None
    assert shown(summary) == truth
    for name, got in summary["datasets"].items():
        assert got["dropped_tokens"] > 0 and got["dropped_docs"] > 0, name
        assert got["delivered_tokens"] == got["taken_tokens"] - sum(
            got[f"{kind}_tokens"] for kind in ("buffered", "unsent", "held", "dropped")
        )
    counts = summary["stage_counts"]["DocumentFilter"]
    assert counts["dropped_tokens"] == sum(
        d["dropped_tokens"] for d in summary["datasets"].values()
    )
    assert main(["state", "show", str(tmp_path / "state.fms")]) == 0
    text = capsys.readouterr().out
    assert "dropped by filters" in text
    for name, got in truth.items():
        row = next(line.split() for line in text.splitlines() if line.startswith(name + " "))
        assert row[1:3] == [f"{got['docs']:,}", f"{got['tokens']:,}"], row
        dropped = summary["datasets"][name]
        assert row[6:8] == [f"{dropped['dropped_docs']:,}", f"{dropped['dropped_tokens']:,}"]


@pytest.mark.parametrize("how", ["skip", "skip_steps"])
@pytest.mark.parametrize(
    "stages", [pack_only, None, filtered], ids=["no-shuffle", "default", "filter"]
)
def test_skipped_steps_are_counted_and_said(info, how, stages):
    """Skipped batches are passed over: their lines are consumed, counted in the totals
    and named as skipped lines."""
    config = base_config(info, bos_token=None, eos_token=None)
    reference = take(build_dataloader(config, stages=stages), 14)
    if how == "skip_steps":
        config = {**config, "skip_steps": [[4, 3]]}
    loader = build_dataloader(config, stages=stages)
    got = take(loader, 4)
    if how == "skip":
        loader.skip(3)
    got += take(loader, 7)
    summary = summarize([roundtrip(loader.snapshot(settle=True))])
    assert summary["steps"] == 14 and summary["lines"] == 14 * config["batch_size"]
    assert summary["skipped_lines"] == 3 * config["batch_size"]
    assert shown(summary) == delivered_truth(info, config, got + reference[4:7])


def test_without_config_the_text_and_plot_say_what_they_leave_out(info, tmp_path, capsys):
    figure = pytest.importorskip("matplotlib.figure")
    config = base_config(info, num_workers=1, bos_token=None, eos_token=None)
    loader = build_dataloader(config)
    take(loader, 5)  # mid-item with a worker: lines past the recorded state
    saved = roundtrip(loader.snapshot())
    advance = sum(entry["advance"] for entry in saved["shards"])
    assert advance > 0
    save_state(str(tmp_path / "state.fms"), saved)
    drawn = []
    savefig = figure.Figure.savefig

    def record(fig, *args, **kwargs):
        drawn.extend(t.get_text() for t in fig.texts)
        drawn.extend(ax.get_title() for ax in fig.axes)
        return savefig(fig, *args, **kwargs)

    plot = str(tmp_path / "state.png")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(figure.Figure, "savefig", record)
        assert main(["state", "show", str(tmp_path / "state.fms"), "--plot", plot]) == 0
    text = capsys.readouterr().out
    said = f"{advance:,} of {5 * config['batch_size']:,} lines delivered were emitted after"
    assert f"note: {said}" in text
    assert any(said in t for t in drawn), drawn
    assert any("not every line counted" in t for t in drawn), drawn
    # With the config the lines are replayed: exact, and said to be.
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ["state", "show", str(tmp_path / "state.fms"), "--config", str(tmp_path / "config.json")]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "note:" not in text and "the counts below are exact" in text
