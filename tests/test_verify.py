"""``fmsdata verify`` (issue 46): exact on the default chain and on every example's stage,
order and format; a planted stage that draws from ``random.random()`` without a seed, or
keeps a generator its state does not save, is found and named."""

from __future__ import annotations

import json
import os
import random

import pytest
import yaml

from fmsdata.cli.main import main
from fmsdata.cli.objects import load_object
from fmsdata.data.synthetic import write_corpus
from fmsdata.errors import ConfigError
from fmsdata.stages import SpanStage, TokenStage
from fmsdata.verify.runs import verify

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")


class Coin(SpanStage):
    """Drops about a third of the lines by an unseeded coin: ``random.random()``."""

    def __next__(self):
        while True:
            line = next(self.source)
            if random.random() < 0.7:
                return line


def coin(shard):
    return shard.shuffle(Coin(shard.pack(shard.documents())))


class Forgetful(SpanStage):
    """A coin seeded per shard whose position its state does not keep: two fresh runs
    agree, a resumed one does not."""

    def __init__(self, source, key):
        super().__init__(source)
        self.rng = random.Random(key)

    def __next__(self):
        while True:
            line = next(self.source)
            if self.rng.random() < 0.7:
                return line


def forgetful(shard):
    return shard.shuffle(Forgetful(shard.pack(shard.documents()), shard.key("coin")))


class Jitter(TokenStage):
    """Moves a line's first token by an unseeded coin."""

    def apply(self, tokens, content, line):
        if content and random.random() < 0.5:
            tokens[0] += 1
        return content


def jitter(shard):
    return Jitter(shard.shuffle(shard.pack(shard.documents())))


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify")
    info = write_corpus(
        root / "data", {"web": 3, "code": 2}, docs_per_file=12, mean_length=30, first_token=16
    )
    return dict(
        data_path=info.root,
        datasets=["web", "code"],
        weights=[2, 1],
        seq_length=32,
        batch_size=4,
        logical_shards=4,
        shuffle_window=4,
        bos_token=1,
        eos_token=2,
    )


def test_the_default_chain_is_exact_across_resumes_workers_and_world_sizes(config):
    report = verify(config, steps=24, world_sizes=(1, 2, 4), workers=(0, 2))
    assert report.exact, report.text()
    assert report.epoch_step is not None and 0 < report.epoch_step < 24
    covered = "\n".join(report.covered)
    for k in (0, report.epoch_step - 1, report.epoch_step, 12):
        assert f"resumed at step {k}, 1 rank(s) x 0 worker(s)" in covered
    assert "resumed at step 12, 1 rank(s) x 2 worker(s)" in covered
    for world in (2, 4):
        assert f"rescaled from 1 to {world} rank(s) at step 12" in covered
        assert f"unbroken run, {world} rank(s) x 0 worker(s)" in covered
    assert report.text().startswith("exact: ")


@pytest.mark.parametrize(
    "spec", ["custom_stage.py:thinned", "custom_order.py:file_shuffled"], ids=["stage", "order"]
)
def test_every_example_stage_is_exact(config, spec):
    factory = load_object(os.path.join(EXAMPLES, spec), "--stages")
    report = verify(config, stages=factory, steps=20, world_sizes=(1, 2), workers=(0,))
    assert report.exact, report.text()
    assert report.epoch_step is not None


def test_the_example_format_is_exact(config, tmp_path):
    from fmsdata import register_handler

    example = load_object(os.path.join(EXAMPLES, "custom_format.py:convert_arrow_corpus"), "")
    handler = load_object(os.path.join(EXAMPLES, "custom_format.py:TokLenHandler"), "")
    root = config["data_path"]
    files = sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, names in os.walk(root)
        for f in names
        if f.endswith(".arrow")
    )
    example(root, files, str(tmp_path / "toklen"))
    register_handler(handler)
    toklen = {**config, "data_path": str(tmp_path / "toklen"), "file_type": "toklen"}
    report = verify(toklen, steps=20, world_sizes=(1, 2), workers=(0,))
    assert report.exact, report.text()


@pytest.mark.parametrize(
    ("factory", "stage", "why"),
    [
        (coin, "test_verify.Coin", "two chains built alike give different outputs"),
        (forgetful, "test_verify.Forgetful", "saved after"),
        (jitter, "test_verify.Jitter", "two chains built alike give different outputs"),
    ],
    ids=["unseeded", "unsaved-generator", "unseeded-token-stage"],
)
def test_a_stage_that_breaks_exactness_is_named(config, factory, stage, why):
    report = verify(config, stages=factory, steps=16, world_sizes=(1,), workers=(0,))
    assert not report.exact
    blame = report.difference.blame
    assert blame is not None, report.text()
    assert blame.stage == stage
    assert why in blame.why
    assert f"stage {stage}" in report.text()


def test_the_command_line_reports_exact_or_the_stage(config, tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import random\n"
        "from fmsdata.stages import SpanStage\n\n\n"
        "class Noisy(SpanStage):\n"
        "    def __next__(self):\n"
        "        while True:\n"
        "            line = next(self.source)\n"
        "            if random.random() < 0.7:\n"
        "                return line\n\n\n"
        "def noisy(shard):\n"
        "    return shard.shuffle(Noisy(shard.pack(shard.documents())))\n"
    )
    common = ["verify", "--config", str(path), "--steps", "12", "--world-sizes", "1,2"]
    assert main([*common, "--workers", "0"]) == 0
    assert capsys.readouterr().out.startswith("exact: ")
    assert main([*common, "--workers", "0", "--stages", f"{planted}:noisy", "--json"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert found["exact"] is False
    assert found["difference"]["stage"] == "planted.Noisy"
    # An unseeded draw shows within the first steps (which one is up to the draws).
    assert 0 <= found["difference"]["step"] < 12


def test_settings_that_cannot_be_checked_are_refused(config):
    with pytest.raises(ConfigError, match="world size 3 cannot run the global batch"):
        verify(config, steps=4, world_sizes=(1, 3))
    with pytest.raises(ConfigError, match="world size 8 cannot run"):
        verify(config, steps=4, world_sizes=(1, 8))
    assert main(["verify", "--config", "x.yaml", "--stages", "nocolon"]) == 2


def test_a_run_too_short_for_an_epoch_says_so(config):
    report = verify({**config, "logical_shards": 1}, steps=2, world_sizes=(1,), workers=(0,))
    assert report.exact
    assert any("no epoch of any dataset ended within 2 steps" in n for n in report.notes)
