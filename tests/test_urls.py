"""Issue 45: every path a user can give is a URL only where fmsdata can use one.

A ``scheme://`` value that a place cannot use is a ``ConfigError`` (a usage error on the
command line) naming the field or argument and the value, never a local folder named
``s3:``. The sweep is tested as a class: every config field, command-line argument and
path-taking function is classified (a new one without a classification fails here), and
each is tried with a URL of a known protocol and of an unknown one.
"""

import argparse
import dataclasses
import importlib
import os

import pytest

from fmsdata.cli.main import build_parser, main
from fmsdata.cli.parser import PathArg
from fmsdata.config import PATH_FIELDS, SECTIONS, LoaderConfig
from fmsdata.errors import ConfigError
from fmsdata.util.urls import is_url, local_path, location, url_scheme

UNKNOWN = "s4://bucket/x"  # no fsspec protocol: refused everywhere
KNOWN = "s3://bucket/x"  # usable where a place may be remote, refused where it must be local
READ_ONLY = "https://host/x"  # readable, never written


@pytest.fixture(autouse=True)
def here(tmp_path, monkeypatch):
    """Run in an empty folder, and check nothing was made there (no ``s3:`` folder)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield
    assert os.listdir(cwd) == []


@pytest.mark.parametrize(
    "value, scheme",
    [
        ("s3://b/k", "s3"),
        ("file:///tmp/x", "file"),
        ("simplecache::s3://b", "simplecache::s3"),
        ("S3://b", "S3"),
        ("/data/s3://odd", None),
        ("relative/path", None),
        ("C:\\data", None),
        ("s3:", None),
        ("", None),
        (None, None),
        (3, None),
    ],
)
def test_url_scheme(value, scheme):
    assert url_scheme(value) == scheme
    assert is_url(value) == (scheme is not None)


def test_location_and_local_path():
    assert location("/d/x", "f") == "/d/x"
    assert location(KNOWN, "f", write=True) == KNOWN
    assert location(READ_ONLY, "f") == READ_ONLY
    assert local_path("file:///tmp/x", "f") == "/tmp/x"
    assert local_path("rel/x", "f") == "rel/x"
    with pytest.raises(ConfigError, match=r"f='s4://bucket/x': unknown URL protocol 's4'"):
        location(UNKNOWN, "f")
    with pytest.raises(ConfigError, match=r"did you mean s3://"):
        location("s3x://b/k", "f")
    with pytest.raises(ConfigError, match=r"chained"):
        location("simplecache::s3://b/k", "f")
    with pytest.raises(ConfigError, match=r"f='https://host/x': fmsdata writes here"):
        location(READ_ONLY, "f", write=True)
    with pytest.raises(ConfigError, match=r"f='s3://bucket/x': must be a path on this machine"):
        local_path(KNOWN, "f")


# -- config fields ------------------------------------------------------------------------

# LoaderConfig fields holding strings that are not paths (names, enums, an endpoint URL).
NOT_PATH_FIELDS = {
    "datasets",
    "allow_changes",
    "schedule_unit",
    "schedule_interpolation",
    "file_type",
    "col_name",
    "text_field",
    "token_dtype",
    "endpoint_url",
    "aws_profile",
    "storage_options",
    "packing",
    "document_order",
    "multiprocessing_context",
    "batch_format",
    "output_dtype",
    "mix_policy",  # "odm", "doremi" or "module:Class": an import path, not a file's
    "mix_policy_options",
}


def test_every_string_field_is_classified():
    strings = {
        f.name
        for section in SECTIONS.values()
        for f in dataclasses.fields(section)
        if "str" in str(f.type) or "Literal" in str(f.type)
    }
    assert strings - NOT_PATH_FIELDS == set(PATH_FIELDS)
    assert set(PATH_FIELDS) <= strings
    assert set(PATH_FIELDS.values()) <= {"read", "write", "local"}


@pytest.mark.parametrize("field", sorted(PATH_FIELDS))
def test_each_path_field_takes_a_url_only_where_it_can(field):
    kind = PATH_FIELDS[field]
    base = {"data_path": "/data/root", field: None}

    def build(value):
        return LoaderConfig(**{**base, field: value})

    with pytest.raises(ConfigError, match=f"{field}='s4://bucket/x'"):
        build(UNKNOWN)
    if kind == "local":
        with pytest.raises(ConfigError, match=f"{field}='s3://bucket/x': must be a path on"):
            build(KNOWN)
        assert getattr(build("file:///tmp/x"), field) == "/tmp/x"
    else:
        assert getattr(build(KNOWN), field) == KNOWN
    if kind == "write":
        with pytest.raises(ConfigError, match=f"{field}='https://host/x': fmsdata writes"):
            build(READ_ONLY)


def test_config_file_urls_are_refused_by_name():
    with pytest.raises(ConfigError, match="config file='s3://bucket/x': must be a path"):
        LoaderConfig.from_yaml(KNOWN)


# -- command-line arguments ---------------------------------------------------------------

# Arguments that are not paths, by command (the storage options are URLs of endpoints).
NOT_PATH_ARGS = {
    "": {"verbose", "version", "debug"},
    "*": {"help", "endpoint_url", "profile", "anonymous", "retries", "backoff"},
    "demo": {"batches", "workers"},
    "tokenize": {
        "dataset",
        "text_field",
        "shard_size",
        "fmt",
        "eos_token",
        "workers",
        "backend",
        "num_shards",
        "shard_id",
        "strict",
        "restart",
    },
    "index": {
        "datasets",
        "file_type",
        "col_name",
        "text_field",
        "token_dtype",
        "separator",
        "workers",
    },
    "inspect": {
        "file_type",
        "col_name",
        "text_field",
        "token_dtype",
        "separator",
        "samples",
        "json",
    },
    "download": {"jobs", "include", "exclude", "dry_run"},
    "bench": {"overrides", "batches", "warmup", "seconds", "workers", "json"},
    "state show": {"json", "stages"},
    "state diff": {"json", "stages"},
    # --stages names importable code; --doc a document; --verify and --out are paths.
    "trace": {"step", "doc", "until", "batch", "world_size", "stages", "json"},
    # --stages and --handler name importable code (a module or a .py file of this machine).
    "warm": {"overrides"},
    "verify": {"overrides", "stages", "handler", "steps", "world_sizes", "workers", "json"},
}


def commands(parser=None, prefix=()):
    """``(argv prefix, parser)`` of every command (a parser without subcommands)."""
    parser = parser or build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, sub in subs[0].choices.items():
        yield from commands(sub, (*prefix, name))


def not_paths(command):
    return NOT_PATH_ARGS["*"] | NOT_PATH_ARGS[" ".join(command)]


def path_arguments():
    for command, parser in commands():
        for action in parser._actions:
            if isinstance(action.type, PathArg):
                yield pytest.param(command, action, id=f"{' '.join(command)} {action.dest}")


def test_every_argument_of_every_command_is_classified():
    top = {a.dest for a in build_parser()._actions} - {"command", "help"}
    assert top == NOT_PATH_ARGS[""]
    unclassified = []
    for command, parser in commands():
        for action in parser._actions:
            if not isinstance(action.type, PathArg) and action.dest not in not_paths(command):
                unclassified.append((" ".join(command), action.dest))
    assert unclassified == []
    assert len(list(path_arguments())) >= 14


def argv_with(command, parser, target, value):
    """The shortest command line that parses, with ``value`` for ``target``."""
    argv = list(command)
    for action in parser._actions:
        given = value if action is target else "x"
        if action.option_strings:
            if action.required or action is target:
                argv += [action.option_strings[-1], given]
        elif action.nargs in (None, "+") or action is target:
            argv.append(given)
    return argv


@pytest.mark.parametrize("command, action", list(path_arguments()))
def test_each_path_argument_takes_a_url_only_where_it_can(command, action, capsys):
    parser = dict(commands())[command]
    (action,) = [a for a in parser._actions if a.dest == action.dest]  # this parser's own
    name = argparse._get_action_name(action)
    refused = [UNKNOWN] + ([KNOWN] if action.type.kind == "local" else [])
    for value in refused:
        with pytest.raises(SystemExit) as stop:
            main(argv_with(command, parser, action, value))
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {name}: {value!r}: " in err, err
    if action.type.kind != "local":
        args = build_parser().parse_args(argv_with(command, parser, action, KNOWN))
        assert KNOWN in (getattr(args, action.dest), [KNOWN])


# -- functions that take a path ------------------------------------------------------------


def _tokenize_spec(**paths):
    from fmsdata.tokenize import TokenizeSpec

    return TokenizeSpec(
        **{"output_dir": "out", "dataset": "d", "tokenizer": "stdlib-bpe-4k", **paths}
    )


def _env_cache(value, monkeypatch):
    from fmsdata.handlers.derived import default_cache_dir

    monkeypatch.setenv("FMSDATA_CACHE", value)
    return default_cache_dir()


def _fms(**fields):
    from fmsdata.compat.fms_fsdp import get_data_loader, loader_config

    if "order" in fields:
        order = fields.pop("order")
        return get_data_loader({"data_path": "d", **fields}, 0, 1, order=order)
    return loader_config({"data_path": "d", **fields})


class _NoLoader:
    config = None


def _checkpoint(name):
    from fmsdata import checkpoint

    calls = {
        "save_loader_state": lambda v: checkpoint.save_loader_state(_NoLoader(), v),
        "load_loader_state": lambda v: checkpoint.load_loader_state(_NoLoader(), v),
        "latest_checkpoint": checkpoint.latest_checkpoint,
        "step_folders": checkpoint.step_folders,
        "rank_files": checkpoint.rank_files,
        "read_checkpoint": checkpoint.read_checkpoint,
    }
    return calls[name]


# (what the message names, how to call it with a value, where it may be)
FUNCTIONS = [
    ("save_loader_state(ckpt_dir)", lambda v, mp: _checkpoint("save_loader_state")(v), "write"),
    ("load_loader_state(ckpt_dir)", lambda v, mp: _checkpoint("load_loader_state")(v), "read"),
    ("latest_checkpoint(root)", lambda v, mp: _checkpoint("latest_checkpoint")(v), "read"),
    ("step_folders(root)", lambda v, mp: _checkpoint("step_folders")(v), "read"),
    ("rank_files(ckpt_dir)", lambda v, mp: _checkpoint("rank_files")(v), "read"),
    ("read_checkpoint(ckpt_dir)", lambda v, mp: _checkpoint("read_checkpoint")(v), "read"),
    (
        "checkpoint_dir",
        lambda v, mp: __import__("fmsdata.checkpoint").checkpoint.AutoCheckpointer(v, 1),
        "write",
    ),
    (
        "save_state(path)",
        lambda v, mp: importlib.import_module("fmsdata.state.file").save_state(v, {}),
        "local",
    ),
    (
        "load_state(path)",
        lambda v, mp: importlib.import_module("fmsdata.state.file").load_state(v),
        "local",
    ),
    (
        "peek_state(path)",
        lambda v, mp: importlib.import_module("fmsdata.state.file").peek_state(v),
        "local",
    ),
    (
        "SafeFileSystemReader(path)",
        lambda v, mp: importlib.import_module("fmsdata.state.dcp_read").SafeFileSystemReader(v),
        "local",
    ),
    (
        "read_metadata(folder)",
        lambda v, mp: importlib.import_module("fmsdata.state.dcp_read").read_metadata(v),
        "local",
    ),
    ("output_dir", lambda v, mp: _tokenize_spec(output_dir=v), "local"),
    ("tokenizer", lambda v, mp: _tokenize_spec(tokenizer=v), "local"),
    (
        "input",
        lambda v, mp: __import__("fmsdata.tokenize.inputs").tokenize.inputs.find_inputs([v]),
        "local",
    ),
    (
        "tokenizer",
        lambda v, mp: __import__("fmsdata.handlers.text").handlers.text.TextTokenizer(v),
        "local",
    ),
    ("$FMSDATA_CACHE", _env_cache, "local"),
    (
        "index_root(root)",
        lambda v, mp: importlib.import_module("fmsdata.data.indexing").index_root(v, None),
        "write",
    ),
    (
        "index_root(cache_dir)",
        lambda v, mp: importlib.import_module("fmsdata.data.indexing").index_root(
            "r", None, cache_dir=v
        ),
        "local",
    ),
    ("metadata", lambda v, mp: __import__("fmsdata").get_dataset(v, 8), "read"),
    ("cache_dir", lambda v, mp: __import__("fmsdata").get_dataset("m", 8, cache_dir=v), "local"),
    (
        "download source",
        lambda v, mp: __import__("fmsdata.remote.mirror").remote.mirror.plan_mirror(v, "d", None),
        "read",
    ),
    (
        "download destination",
        lambda v, mp: __import__("fmsdata.remote.mirror").remote.mirror.plan_mirror("s", v, None),
        "local",
    ),
    (
        "--plot",
        lambda v, mp: importlib.import_module("fmsdata.cli.plots").check_plot_target(v),
        "local",
    ),
    (
        "write_corpus(root)",
        lambda v, mp: importlib.import_module("fmsdata.data.synthetic").write_corpus(v, {"a": 1}),
        "local",
    ),
    ("tokenizer_path", lambda v, mp: _fms(tokenizer_path=v), "local"),
    ("ckpt_save_path", lambda v, mp: _fms(ckpt_save_path=v), "write"),
    (
        "ckpt_load_path",
        lambda v, mp: _fms(ckpt_load_path=v, resuming_dataset=True, order="fmsdata"),
        "read",
    ),
    ("ckpt_save_path", lambda v, mp: _fms(ckpt_save_path=v, order="fms-fsdp"), "local"),
    ("ckpt_load_path", lambda v, mp: _fms(ckpt_load_path=v, order="fms-fsdp"), "local"),
    ("data_path", lambda v, mp: _fms(data_path=v, order="fms-fsdp"), "local"),
]


@pytest.mark.parametrize("what, call, kind", FUNCTIONS, ids=[f"{w}-{k}" for w, _, k in FUNCTIONS])
def test_each_function_takes_a_url_only_where_it_can(what, call, kind, monkeypatch):
    pattern = f"{what}='{{}}'".replace("(", r"\(").replace(")", r"\)").replace("$", r"\$")
    refused = [UNKNOWN] + ([KNOWN] if kind == "local" else [])
    for value in refused:
        with pytest.raises(ConfigError, match=pattern.format(value)):
            call(value, monkeypatch)
    if kind == "write":
        with pytest.raises(ConfigError, match=pattern.format(READ_ONLY)):
            call(READ_ONLY, monkeypatch)
