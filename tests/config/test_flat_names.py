"""Every flat field name at every way into and out of the config (constructor, from_dict
flat and sectioned, YAML flat, sectioned and under fms-fsdp's ``data:`` wrapper, CLI
overrides, replace, to_dict), checked against values written out by hand here."""

import json
import pickle

import pytest
import yaml

from fmsdata import ConfigError, LoaderConfig
from fmsdata.config import SECTIONS, field_names_of

# field -> (value as a user writes it, the value to_dict gives back, fields it needs).
SAMPLES = {
    "data_path": ("/other/root", "/other/root", {}),
    "file_type": ("npy", "npy", {}),
    "col_name": ("input_ids, tokens", "input_ids,tokens", {}),
    "text_field": ("body", "body", {}),
    "tokenizer": ("/t/tokenizer.json", "/t/tokenizer.json", {}),
    "token_dtype": ("uint16", "uint16", {}),
    "doc_separator": (3, 3, {}),
    "strict": (True, True, {}),
    "cache_dir": ("/c", "/c", {}),
    "datasets": ("web, code", ["web", "code"], {}),
    "weights": ("1,3", [1.0, 3.0], {"datasets": "a,b"}),
    "weight_schedule": (
        [[0, [1, 3]], [10, "1,1"]],
        [[0, [1.0, 3.0]], [10, [1.0, 1.0]]],
        {"datasets": "a,b"},
    ),
    "schedule_unit": ("steps", "steps", {}),
    "schedule_interpolation": ("linear", "linear", {}),
    "schedule_resolution": (7, 7, {}),
    "global_batch_size": ("16", 16, {}),
    "mix_policy": ("odm", "odm", {}),
    "mix_update_every": ("25", 25, {}),
    "odm_smoothing": (0.5, 0.5, {}),
    "odm_exploration": ("0.1", 0.1, {}),
    "doremi_reference_losses": ("2.5, 3", [2.5, 3.0], {}),
    "doremi_step_size": (0.5, 0.5, {}),
    "doremi_smoothing": (0.01, 0.01, {}),
    "mix_policy_options": ({"rate": 2}, {"rate": 2}, {"mix_policy": "mypolicies:Greedy"}),
    "bos_token": (5, 5, {}),
    "eos_token": (6, 6, {}),
    "strip_tokens": ("0,1", [0, 1], {}),
    "min_length": (3, 3, {}),
    "document_order": ("sequential", "sequential", {}),
    "seq_length": (128, 128, {}),
    "packing": ("pad", "pad", {"pad_token": 0}),
    "pad_token": (9, 9, {}),
    "bol_token": (7, 7, {}),
    "eol_token": (8, 8, {}),
    "shuffle_window": (0, 0, {}),
    "pack_window": ("64", 64, {}),
    "fim_training": (True, True, {}),
    "psm_rate": (0.25, 0.25, {}),
    "spm_rate": ("0.5", 0.5, {}),
    "fim_pre": (10, 10, {}),
    "fim_mid": (11, 11, {}),
    "fim_suf": (12, 12, {}),
    "fim_min_length": (4, 4, {}),
    "batch_size": (3, 3, {}),
    "batch_format": ("tuple", "tuple", {}),
    "output_dtype": ("int32", "int32", {}),
    "ignore_first_labels": (1, 1, {}),
    "return_position_ids": (True, True, {}),
    "return_cu_seqlens": (True, True, {}),
    "return_document_ids": (True, True, {}),
    "return_step_digest": (True, True, {}),
    "vocab_size": (1000, 1000, {}),
    "logical_shards": (16, 16, {}),
    "seed": (7, 7, {}),
    "num_workers": (0, 0, {}),
    "prefetch_factor": (4, 4, {}),
    "pin_memory": (True, True, {}),
    "multiprocessing_context": ("spawn", "spawn", {}),
    "open_files": (5, 5, {}),
    "worker_timeout": (30, 30.0, {}),
    "endpoint_url": ("http://127.0.0.1:9000", "http://127.0.0.1:9000", {}),
    "aws_profile": ("research", "research", {}),
    "anonymous": (True, True, {}),
    "storage_options": ({"key": "k", "kw": {"a": 1}}, {"key": "k", "kw": {"a": 1}}, {}),
    "remote_cache_gb": (2, 2.0, {}),
    "remote_retries": (3, 3, {}),
    "remote_backoff": (0.1, 0.1, {}),
    "checkpoint_dir": ("/ck", "/ck", {}),
    "checkpoint_every": (10, 10, {"checkpoint_dir": "/ck"}),
    "checkpoint_keep": (5, 5, {}),
    "allow_mix_change": (True, True, {}),
    "allow_changes": (["seq_length"], ["seq_length"], {}),
    "skip_steps": ([[10, 2], ["20", 1]], [[10, 2], [20, 1]], {}),
}

# The flat to_dict of LoaderConfig(data_path="/d") as fmsdata wrote it before the config
# was split into sections: saved configs and state fingerprints compare against it.
DEFAULTS_BEFORE_SECTIONS = {
    "data_path": "/d", "datasets": None, "weights": None, "weight_schedule": None,
    "schedule_unit": "tokens", "schedule_interpolation": "step", "schedule_resolution": 100,
    "global_batch_size": None, "allow_mix_change": False, "skip_steps": [], "file_type": None,
    "col_name": "tokens", "text_field": "text", "tokenizer": None, "token_dtype": None,
    "doc_separator": None, "strict": False, "cache_dir": None, "endpoint_url": None,
    "aws_profile": None, "anonymous": False, "storage_options": None, "remote_cache_gb": 100.0,
    "remote_retries": 8, "remote_backoff": 0.5, "seq_length": 4096, "batch_size": 8,
    "bos_token": None, "eos_token": None, "bol_token": None, "eol_token": None,
    "strip_tokens": [], "packing": "hard", "pad_token": None, "min_length": 1,
    "logical_shards": 8, "shuffle_window": 160, "pack_window": 128,
    "document_order": "random", "seed": 42,
    "num_workers": 1, "prefetch_factor": 2, "pin_memory": False,
    "multiprocessing_context": None, "vocab_size": None, "return_position_ids": False,
    "return_cu_seqlens": False, "return_document_ids": False, "return_step_digest": False,
    "fim_training": False,
    "psm_rate": 0.0, "spm_rate": 0.0, "fim_pre": None, "fim_mid": None, "fim_suf": None,
    "fim_min_length": 2, "batch_format": "dict", "output_dtype": "int64",
    "ignore_first_labels": 0, "open_files": None, "worker_timeout": 600.0, "checkpoint_dir": None,
    "checkpoint_every": 0, "checkpoint_keep": 2,
    "allow_changes": [],  # added since: a default that changes no fingerprint
    # Added with the mix that follows the loss (state version 6 fills them in older
    # fingerprints: fmsdata.state.format._feedback_of_v5).
    "mix_policy": None, "mix_update_every": 100, "odm_smoothing": 0.9,
    "odm_exploration": None, "doremi_reference_losses": None, "doremi_step_size": 1.0,
    "doremi_smoothing": 0.001, "mix_policy_options": None,
}  # fmt: skip


def section_of(field):
    (name,) = [s for s, cls in SECTIONS.items() if field in field_names_of(cls)]
    return name


def sectioned(flat):
    """``flat`` written as sections (the layout of a sectioned YAML file)."""
    out = {}
    for field, value in flat.items():
        out.setdefault(section_of(field), {})[field] = value
    return out


def test_the_samples_cover_every_field_once():
    names = LoaderConfig.field_names()
    assert len(names) == len(set(names)) == len(SAMPLES) == 73
    assert set(names) == set(SAMPLES) == set(DEFAULTS_BEFORE_SECTIONS)


def test_defaults_give_the_flat_dict_of_before_the_sections():
    assert LoaderConfig(data_path="/d").to_dict() == DEFAULTS_BEFORE_SECTIONS


def check(config, field, expected):
    """``config`` holds ``expected`` for ``field``, read every way there is."""
    assert config.to_dict()[field] == expected
    section = getattr(config, section_of(field))
    assert getattr(config, field) == getattr(section, field)
    assert config.to_dict(sectioned=True)[section_of(field)][field] == expected


@pytest.mark.parametrize("field", LoaderConfig.field_names())
def test_every_flat_name_goes_every_way_in(field, tmp_path):
    value, expected, needs = SAMPLES[field]
    assert expected != DEFAULTS_BEFORE_SECTIONS[field]  # else a dropped value would pass
    base = {"data_path": "/d", **needs}
    flat = {**base, field: value}

    direct = LoaderConfig(**flat)
    check(direct, field, expected)
    check(LoaderConfig.from_dict(flat), field, expected)
    check(LoaderConfig.from_dict(sectioned(flat)), field, expected)
    for layout in (flat, sectioned(flat), {"data": flat}, {"data": sectioned(flat)}):
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(layout))
        assert LoaderConfig.from_yaml(path) == direct, layout

    override = f"{field}={json.dumps(value)}"  # JSON is YAML: how a shell user writes it
    check(LoaderConfig(**base).with_overrides([override]), field, expected)
    path.write_text(yaml.safe_dump(sectioned(base)))
    check(LoaderConfig.from_yaml(path, [override]), field, expected)
    check(LoaderConfig(**base).replace(**{field: value}), field, expected)

    assert LoaderConfig.from_dict(direct.to_dict()) == direct
    assert LoaderConfig.from_dict(direct.to_dict(sectioned=True)) == direct
    assert pickle.loads(pickle.dumps(direct)) == direct


@pytest.mark.parametrize("field", LoaderConfig.field_names())
def test_every_flat_name_is_refused_twice(field):
    value, _, needs = SAMPLES[field]
    values = {"data_path": "/d", **needs, field: value}
    doubled = {**sectioned(values), field: value}
    with pytest.raises(ConfigError, match=rf"given twice: {field!r} \(also in section"):
        LoaderConfig.from_dict(doubled)


def test_a_yaml_file_with_only_a_data_section_reads_as_fms_fsdp_wrapper_would(tmp_path):
    path = tmp_path / "c.yaml"
    # Either reading (the data section, or fms-fsdp's wrapper of flat names) gives this.
    path.write_text("data:\n  data_path: /d\n  file_type: npy\n  col_name: ids\n")
    assert LoaderConfig.from_yaml(path) == LoaderConfig(
        data_path="/d", file_type="npy", col_name="ids"
    )
    # fms-fsdp's wrapper holds fields of every section, flat ...
    path.write_text("data:\n  data_path: /d\n  seq_length: 64\n  datasets: a,b\n")
    assert LoaderConfig.from_yaml(path) == LoaderConfig(
        data_path="/d", seq_length=64, datasets="a,b"
    )
    # ... or a sectioned config, whose own data section is then one level down.
    path.write_text("data:\n  data:\n    data_path: /d\n  lines:\n    seq_length: 64\n")
    assert LoaderConfig.from_yaml(path) == LoaderConfig(data_path="/d", seq_length=64)


def test_a_sectioned_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        """
data:
  data_path: /data/root
  file_type: arrow
mix:
  datasets: [web, code]
  weights: [0.7, 0.3]
documents:
  eos_token: 0
lines:
  seq_length: 2048
  packing: pad
  pad_token: 1
fim:        # an empty section: its defaults
output:
  batch_size: 4
shards:
  logical_shards: 64
workers:
  num_workers: 2
seed: 3     # flat names and sections mix, each field given once
"""
    )
    config = LoaderConfig.from_yaml(path, ["seq_length=4096", "bos_token=2"])
    assert config.lines.seq_length == config.seq_length == 4096
    assert config.packing == "pad" and config.lines.pad_token == 1
    assert config.mix.weights == (0.7, 0.3) and config.datasets == ("web", "code")
    assert config.documents.bos_token == 2 and config.eos_token == 0
    assert config.fim.fim_training is False and config.shards.seed == 3
    assert config.logical_shards == 64 and config.num_workers == 2 and config.batch_size == 4


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"data": {"data_path": "/d", "seq_length": 5}},
            "section 'data' holds fields of other sections: 'seq_length' belongs in section "
            "'lines'",
        ),
        (
            {"data_path": "/d", "lines": {"seq_len": 5}},
            r"unknown config field\(s\) in section 'lines': 'seq_len' \(did you mean "
            r"'seq_length'\?\); known fields: seq_length, packing",
        ),
        ({"data_path": "/d", "lines": 5}, "section 'lines' must be a mapping of its fields"),
        ({"data_path": "/d", "line": {}}, r"'line' \(did you mean 'lines'\?\)"),
        ({"lines": {"seq_length": 5}}, "data_path is required"),
        (
            {"data": {"data_path": "/d"}, "data_path": "/e"},
            r"given twice: 'data_path' \(also in section 'data'\)",
        ),
    ],
)
def test_sectioned_mistakes_name_the_field(values, message):
    with pytest.raises(ConfigError, match=message):
        LoaderConfig.from_dict(values)


def test_sections_as_objects_and_flat_reads():
    config = LoaderConfig(data_path="/d", seq_length=64, bol_token=1)
    same = LoaderConfig(data=config.data, lines=config.lines)
    assert same == config and same.content_capacity == 64 and same.line_length == 65
    changed = config.replace(lines=config.lines.__class__(seq_length=32))
    assert changed.seq_length == 32 and changed.bol_token is None
    with pytest.raises(ConfigError, match=r"given twice: 'seq_length'"):
        config.replace(lines=config.lines, seq_length=5)
    with pytest.raises(ConfigError, match="unknown config field"):
        config.replace(seq_len=5)
    assert not hasattr(config, "seq_len")
    with pytest.raises(AttributeError, match="seq_len"):
        _ = config.seq_len
    assert {"seq_length", "lines", "data_path"} <= set(dir(config))
    with pytest.raises(AttributeError):
        config.seq_length = 5  # frozen, by flat name too


def test_the_sections_and_fields_are_those_documented():
    layout = {name: field_names_of(cls) for name, cls in SECTIONS.items()}
    assert layout == {
        "data": (
            "data_path",
            "file_type",
            "col_name",
            "text_field",
            "tokenizer",
            "token_dtype",
            "doc_separator",
            "strict",
            "cache_dir",
        ),
        "mix": (
            "datasets",
            "weights",
            "weight_schedule",
            "schedule_unit",
            "schedule_interpolation",
            "schedule_resolution",
            "global_batch_size",
            "mix_policy",
            "mix_update_every",
            "odm_smoothing",
            "odm_exploration",
            "doremi_reference_losses",
            "doremi_step_size",
            "doremi_smoothing",
            "mix_policy_options",
        ),
        "documents": ("bos_token", "eos_token", "strip_tokens", "min_length", "document_order"),
        "lines": (
            "seq_length",
            "packing",
            "pad_token",
            "bol_token",
            "eol_token",
            "shuffle_window",
            "pack_window",
        ),
        "fim": (
            "fim_training",
            "psm_rate",
            "spm_rate",
            "fim_pre",
            "fim_mid",
            "fim_suf",
            "fim_min_length",
        ),
        "output": (
            "batch_size",
            "batch_format",
            "output_dtype",
            "ignore_first_labels",
            "return_position_ids",
            "return_cu_seqlens",
            "return_document_ids",
            "return_step_digest",
            "vocab_size",
        ),
        "shards": ("logical_shards", "seed"),
        "workers": (
            "num_workers",
            "prefetch_factor",
            "pin_memory",
            "multiprocessing_context",
            "open_files",
            "worker_timeout",
        ),
        "remote": (
            "endpoint_url",
            "aws_profile",
            "anonymous",
            "storage_options",
            "remote_cache_gb",
            "remote_retries",
            "remote_backoff",
        ),
        "checkpoint": ("checkpoint_dir", "checkpoint_every", "checkpoint_keep"),
        "steering": ("allow_mix_change", "allow_changes", "skip_steps"),
    }


def test_fingerprint_groups_are_those_of_before_the_sections():
    from fmsdata.state import fingerprint

    assert fingerprint.MIX_FIELDS == (
        "datasets",
        "weights",
        "weight_schedule",
        "schedule_unit",
        "schedule_interpolation",
        "schedule_resolution",
        "global_batch_size",
        "mix_policy",
        "mix_update_every",
        "odm_smoothing",
        "odm_exploration",
        "doremi_reference_losses",
        "doremi_step_size",
        "doremi_smoothing",
        "mix_policy_options",
    )
    assert fingerprint._SHARD_FIELDS == ("logical_shards", "seed")
    assert set(fingerprint.LINE_FIELDS) == {
        "seq_length",
        "bos_token",
        "eos_token",
        "bol_token",
        "eol_token",
        "pad_token",
        "strip_tokens",
        "min_length",
        "packing",
        "shuffle_window",
        "pack_window",
        "document_order",
        "fim_training",
        "psm_rate",
        "spm_rate",
        "fim_pre",
        "fim_mid",
        "fim_suf",
        "fim_min_length",
    }
    assert len(fingerprint.LINE_FIELDS) == 19
