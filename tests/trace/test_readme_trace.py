"""The worked example of ``fmsdata trace`` runs on the demo's data as shown: the
demo's steps (tokenized stdlib docstrings, ``loader.yaml``, a state after 100 batches)
are made with its own functions, then each ``$ fmsdata trace`` command of the provenance page
(docs/guide/provenance.md) runs and starts its output as the page shows."""

import os
import shlex

import pytest

from fmsdata.cli.main import main

PAGE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guide", "provenance.md")


def readme_commands():
    """``(argv, first output line)`` of each ``$ fmsdata trace`` in the section."""
    with open(PAGE, encoding="utf-8") as handle:
        text = handle.read()
    section = text[text.index("## fmsdata trace") :]
    block = section[
        section.index("```console") : section.index("```\n", section.index("```console") + 3)
    ]
    lines = block.splitlines()[1:]
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("$ fmsdata trace"):
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + lines[i].strip()
            out.append((shlex.split(command)[1:], lines[i + 1]))
        i += 1
    return out


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from fmsdata import build_dataloader
    from fmsdata.cli.demo import loader_config, next_steps, write_raw
    from fmsdata.data.indexing import index_root
    from fmsdata.handlers import ArrowDocHandler
    from fmsdata.state.file import save_state
    from fmsdata.tokenize import TokenizeSpec, run_tokenize
    from fmsdata.util.textcorpus import bundled_tokenizer_path

    work = str(tmp_path_factory.mktemp("demo"))
    root = os.path.join(work, "tokens")
    write_raw(os.path.join(work, "raw"))
    spec = TokenizeSpec(root, "stdlib", bundled_tokenizer_path(), shard_bytes=200_000)
    run_tokenize(spec, [os.path.join(work, "raw")])
    index_root(root, ArrowDocHandler())
    config = loader_config(root, 0)
    next_steps(work, config)
    head = build_dataloader(config)
    for _, _ in zip(range(100), head):
        pass
    save_state(os.path.join(work, "loader_state.fms"), head.snapshot())
    return work


def test_the_readme_example_runs_as_shown(demo, capsys, monkeypatch):
    commands = readme_commands()
    assert len(commands) == 3
    monkeypatch.chdir(os.path.dirname(demo))
    for argv, first in commands:
        argv = [a.replace("demo/", os.path.basename(demo) + "/") for a in argv]
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        assert out.splitlines()[0] == first, (argv, out[:300])
