"""The command line as a newcomer meets it: quick to answer, every option explained with its
default, argument errors that say what is allowed."""

import argparse
import json
import subprocess
import sys

import pytest

from fmsdata.cli.main import build_parser, main

HEAVY = ("torch", "numpy", "pyarrow", "fsspec", "tokenizers", "yaml")


def subcommand_parsers(parser=None, prefix=()):
    """``(command words, parser)`` of every command and subcommand."""
    parser = parser or build_parser()
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from subcommand_parsers(sub, (*prefix, name))


def test_parsing_the_command_line_imports_nothing_heavy():
    """``fmsdata --help`` and argument errors must not wait for torch (seconds) to import:
    building every command's parser imports none of the heavy packages."""
    code = (
        "import sys\n"
        "from fmsdata.cli.main import build_parser\n"
        "build_parser()\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow  # a fresh interpreter
def test_import_fmsdata_is_lazy_but_complete():
    code = (
        "import sys, fmsdata\n"
        "assert 'torch' not in sys.modules\n"
        "from fmsdata import build_dataloader, LoaderConfig, FileHandler, register_handler\n"
        "assert 'torch' in sys.modules and callable(build_dataloader)\n"
        "assert 'torch.distributed.checkpoint' not in sys.modules  # 0.6 s, only for DCP\n"
        "from fmsdata.checkpoint import LoadPlanner, SafeFileSystemReader\n"
        "assert set(fmsdata.__all__) <= set(dir(fmsdata))\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_every_option_has_help_and_shows_its_default():
    for words, parser in subcommand_parsers():
        text = parser.format_help()
        assert "``" not in text, f"raw RST backticks in fmsdata {' '.join(words)} --help"
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            name = "/".join(action.option_strings) or action.dest
            where = f"fmsdata {' '.join(words)} {name}"
            assert action.help, f"{where} has no help text"
            default = action.default
            if action.option_strings and default not in (None, False, [], argparse.SUPPRESS):
                assert f"(default: {default})" in text.replace("\n", " ").replace("  ", ""), (
                    f"{where}: default {default!r} not shown"
                )


def test_named_choices_match_the_library():
    """The format and backend names the help shows without importing the library."""
    from fmsdata.cli import inspect_cmd, tokenize
    from fmsdata.handlers import _REGISTRY
    from fmsdata.tokenize.plan import OUTPUT_FORMATS
    from fmsdata.tokenize.run import BACKENDS

    builtin = {n for n, c in _REGISTRY.items() if c.__module__.startswith("fmsdata.handlers")}
    assert set(inspect_cmd.BUILTIN_FORMATS) == builtin  # other tests register their own
    assert tokenize.OUTPUT_FORMATS == OUTPUT_FORMATS
    assert tokenize.BACKENDS == BACKENDS


@pytest.mark.parametrize(
    "argv, said",
    [
        (["demo", "--batches", "0"], "--batches: must be at least 2"),
        (["demo", "--batches", "1"], "--batches: must be at least 2"),
        (["demo", "--workers", "0"], "--workers: must be at least 1"),
        (["bench", "c.yaml", "--batches", "0"], "--batches: must be at least 1"),
        (["tokenize", "x", "--tokenizer", "t", "--output-dir", "o", "--workers", "0"], "least 1"),
        (["tokenize", "x", "--tokenizer", "t", "--output-dir", "o", "--format", "x"], "choose"),
        (["download", "a", "b", "--jobs", "-1"], "--jobs: must be at least 1"),
        (["inspect", "p", "--samples", "-1"], "--samples: must be at least 0"),
    ],
)
def test_values_that_check_nothing_are_refused(argv, said, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert said in capsys.readouterr().err


def test_tokenize_help_explains_format_and_backend(capsys):
    with pytest.raises(SystemExit):
        main(["tokenize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "shard format written: arrow" in text and "(default: arrow)" in text
    assert "local: --workers processes here; ray:" in text and "(default: local)" in text
    assert "(default: the inputs' total / 64, between 1MB and 256MB" in text


def test_state_show_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        main(["state", "show", "--help"])
    text = capsys.readouterr().out
    assert "loader_rank_*.fms" in text and "``" not in text and "--plot" in text


def test_json_output_is_parseable_after_help_changes(tmp_path, capsys):
    """--json output stays machine readable (nothing else printed on stdout)."""
    from support import corpus

    corpus(tmp_path / "data")
    assert main(["inspect", str(tmp_path / "data"), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["documents"] > 0 and set(figures["datasets"]) == {"a", "b"}


def test_version_comes_from_the_installed_metadata(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"fmsdata {version('fmsdata')}"
