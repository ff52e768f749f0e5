"""Each section on its own: frozen, keyword-only, validating its own fields with messages
that name the field and quote the value; and what spans sections, in ``LoaderConfig``."""

import dataclasses
import re
import typing

import pytest

from fmsdata import ConfigError, LoaderConfig
from fmsdata.config import (
    BATCH_FORMATS,
    DOCUMENT_ORDERS,
    OUTPUT_DTYPES,
    PACKING_MODES,
    SECTIONS,
    CheckpointConfig,
    DataConfig,
    Decoration,
    DocumentsConfig,
    FimConfig,
    LinesConfig,
    MixConfig,
    OutputConfig,
    RemoteConfig,
    ShardsConfig,
    SteeringConfig,
    WorkersConfig,
)


@pytest.mark.parametrize("name", list(SECTIONS))
def test_sections_are_frozen_keyword_only_dataclasses(name):
    cls = SECTIONS[name]
    params = cls.__dataclass_params__
    assert params.frozen and all(f.kw_only for f in dataclasses.fields(cls))
    section = cls(data_path="/d") if cls is DataConfig else cls()
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(section, first, None)
    with pytest.raises(TypeError):
        cls("/d")  # keyword-only
    assert getattr(LoaderConfig(data_path="/d"), name) == section


@pytest.mark.parametrize(
    "cls, values, message",
    [
        (DataConfig, {"data_path": ""}, "data_path must be a non-empty path or URL, got ''"),
        (DataConfig, {"data_path": "/d", "col_name": ","}, "col_name must name a column"),
        (DataConfig, {"data_path": "/d", "file_type": 3}, "file_type must be a format name"),
        (DataConfig, {"data_path": "/d", "token_dtype": "float32"}, "an integer type, got"),
        (DataConfig, {"data_path": "/d", "token_dtype": "bogus"}, "a numpy integer type"),
        (DataConfig, {"data_path": "/d", "doc_separator": -1}, "doc_separator must be a non-"),
        (DataConfig, {"data_path": "/d", "strict": "yes"}, "strict must be true or false"),
        (DataConfig, {"data_path": "/d", "tokenizer": 5}, "tokenizer must be a path"),
        (MixConfig, {"datasets": "a,a"}, "datasets lists a folder twice: 'a,a'"),
        (MixConfig, {"datasets": ","}, "datasets must name at least one folder"),
        (MixConfig, {"weights": "1,2"}, "weights needs datasets"),
        (MixConfig, {"datasets": "a", "weights": "1,2"}, "weights has 2 entries but datasets"),
        (MixConfig, {"schedule_unit": "days"}, "schedule_unit must be 'tokens' or 'steps'"),
        (MixConfig, {"schedule_resolution": 0}, "schedule_resolution must be positive, got 0"),
        (MixConfig, {"global_batch_size": 0}, "global_batch_size must be positive, got 0"),
        (
            MixConfig,
            {"datasets": "a", "weight_schedule": [[0, [1]]], "schedule_unit": "steps"},
            "needs global_batch_size",
        ),
        (MixConfig, {"datasets": "a", "weight_schedule": [[-1, [1]]]}, "non-negative, got -1"),
        (MixConfig, {"datasets": "a", "weight_schedule": "x"}, "list of \\[at, weights\\]"),
        (DocumentsConfig, {"bos_token": -1}, "bos_token must be a non-negative token id"),
        (DocumentsConfig, {"strip_tokens": "x"}, "strip_tokens must be an integer, got 'x'"),
        (DocumentsConfig, {"min_length": -1}, "min_length must be a non-negative integer"),
        (DocumentsConfig, {"document_order": "x"}, r"document_order must be one of \("),
        (LinesConfig, {"seq_length": 0}, "seq_length must be a positive integer, got 0"),
        (
            LinesConfig,
            {"packing": "tight"},
            r"packing must be one of \('hard', 'pad', 'best_fit'\)",
        ),
        (LinesConfig, {"packing": "pad"}, "packing='pad' needs pad_token, got pad_token=None"),
        (
            LinesConfig,
            {"packing": "best_fit"},
            "packing='best_fit' needs pad_token, got pad_token=None",
        ),
        (LinesConfig, {"pack_window": 0}, "pack_window must be a positive integer, got 0"),
        (LinesConfig, {"seq_length": 1, "bol_token": 1, "eol_token": 2}, "leaves no room"),
        (LinesConfig, {"shuffle_window": -1}, "shuffle_window must be a non-negative integer"),
        (FimConfig, {"psm_rate": 1.5}, r"psm_rate must be a probability in \[0, 1\], got 1.5"),
        (FimConfig, {"psm_rate": 0.6, "spm_rate": 0.6}, "psm_rate \\+ spm_rate must be at"),
        (FimConfig, {"fim_pre": -2}, "fim_pre must be a non-negative token id"),
        (FimConfig, {"fim_min_length": -1}, "fim_min_length must be a non-negative integer"),
        (FimConfig, {"fim_training": 1}, "fim_training must be true or false, got 1"),
        (OutputConfig, {"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        (OutputConfig, {"batch_format": "list"}, "batch_format must be one of"),
        (OutputConfig, {"output_dtype": "int16"}, "output_dtype must be one of"),
        (OutputConfig, {"ignore_first_labels": -1}, "ignore_first_labels must be an integer"),
        (OutputConfig, {"ignore_first_labels": True}, "ignore_first_labels must be an integer"),
        (
            OutputConfig,
            {"output_dtype": "int32", "return_document_ids": True},
            "return_document_ids needs output_dtype='int64'",
        ),
        (OutputConfig, {"vocab_size": 0}, "vocab_size must be positive or None, got 0"),
        (ShardsConfig, {"logical_shards": 0}, "logical_shards must be a positive integer"),
        (ShardsConfig, {"seed": -1}, "seed must be a non-negative integer, got -1"),
        (WorkersConfig, {"num_workers": -1}, "num_workers must be a non-negative integer"),
        (WorkersConfig, {"prefetch_factor": 0}, "prefetch_factor must be a positive integer"),
        (WorkersConfig, {"multiprocessing_context": "threads"}, "fork, spawn, forkserver"),
        (WorkersConfig, {"open_files": 0}, "open_files must be a positive integer or None"),
        (WorkersConfig, {"worker_timeout": -1}, "worker_timeout must be a non-negative number"),
        (WorkersConfig, {"worker_timeout": "soon"}, "worker_timeout"),
        (WorkersConfig, {"pin_memory": "yes"}, "pin_memory must be true or false, got 'yes'"),
        (RemoteConfig, {"endpoint_url": ""}, "endpoint_url must be a non-empty string"),
        (RemoteConfig, {"storage_options": ["secret"]}, "got a list"),
        (RemoteConfig, {"remote_cache_gb": 0}, "remote_cache_gb must be positive, got 0"),
        (RemoteConfig, {"remote_retries": 0}, "remote_retries must be at least 1, got 0"),
        (RemoteConfig, {"remote_backoff": "soon"}, "remote_backoff must be a number, got"),
        (RemoteConfig, {"anonymous": "no"}, "anonymous must be true or false, got 'no'"),
        (CheckpointConfig, {"checkpoint_every": 5}, "checkpoint_every=5 needs checkpoint_dir"),
        (CheckpointConfig, {"checkpoint_keep": -1}, "checkpoint_keep must be a non-negative"),
        (CheckpointConfig, {"checkpoint_dir": ""}, "checkpoint_dir must be a path"),
        (SteeringConfig, {"skip_steps": [[1, 0]]}, r"step >= 0 and n >= 1, got \[1, 0\]"),
        (SteeringConfig, {"skip_steps": [5]}, r"skip_steps entries are \[step, n\], got 5"),
        (SteeringConfig, {"allow_mix_change": 1}, "allow_mix_change must be true or false"),
    ],
)
def test_each_section_checks_its_own_fields(cls, values, message):
    with pytest.raises(ConfigError, match=message):
        cls(**values)
    # ... and says the same when the field comes through LoaderConfig by its flat name.
    with pytest.raises(ConfigError, match=message):
        LoaderConfig(**{"data_path": "/d", **values})


def test_storage_options_never_show_their_values():
    with pytest.raises(ConfigError) as caught:
        RemoteConfig(storage_options=["hunter2"])
    assert "hunter2" not in str(caught.value)
    with pytest.raises(ConfigError, match="got list") as caught:
        LoaderConfig.from_dict({"data_path": "/d", "remote": ["hunter2"]})
    assert "hunter2" not in str(caught.value)
    config = LoaderConfig(data_path="/d", storage_options={"secret": "hunter2"})
    assert "hunter2" not in repr(config) and "hunter2" not in repr(config.remote)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"vocab_size": 10, "bos_token": 10}, "bos_token=10 is outside vocab_size=10"),
        ({"vocab_size": 10, "pad_token": 12}, "pad_token=12 is outside vocab_size=10"),
        ({"vocab_size": 10, "fim_suf": 10}, "fim_suf=10 is outside vocab_size=10"),
        (
            {"seq_length": 8, "ignore_first_labels": 9},
            re.escape("ignore_first_labels must be an integer from 0 to seq_length (8), got 9"),
        ),
    ],
)
def test_what_spans_sections_is_checked_by_the_whole(changes, message):
    for field in changes:  # each alone is valid in its section
        LoaderConfig(data_path="/d", **{field: changes[field]})
    with pytest.raises(ConfigError, match=message):
        LoaderConfig(data_path="/d", **changes)
    base = LoaderConfig(data_path="/d")
    with pytest.raises(ConfigError, match=message):
        base.replace(**changes)


def test_enum_fields_are_literals_and_their_constants_agree():
    hints = {
        (LinesConfig, "packing"): PACKING_MODES,
        (DocumentsConfig, "document_order"): DOCUMENT_ORDERS,
        (OutputConfig, "batch_format"): BATCH_FORMATS,
        (OutputConfig, "output_dtype"): OUTPUT_DTYPES,
    }
    for (cls, field), allowed in hints.items():
        assert typing.get_args(typing.get_type_hints(cls)[field]) == allowed
    assert PACKING_MODES == ("hard", "pad", "best_fit")
    assert DOCUMENT_ORDERS == ("random", "sequential")
    assert BATCH_FORMATS == ("dict", "tuple") and OUTPUT_DTYPES == ("int64", "int32")
    mix = typing.get_type_hints(MixConfig)
    assert typing.get_args(mix["schedule_unit"]) == ("tokens", "steps")
    assert typing.get_args(mix["schedule_interpolation"]) == ("step", "linear")


def test_decoration_is_built_from_the_documents_section():
    documents = DocumentsConfig(bos_token=1, eos_token=2, strip_tokens="0,3", min_length=4)
    assert documents.decoration == Decoration(bos=1, eos=2, strip=frozenset({0, 3}), min_length=4)
    # The decoration leaves out the order: what a file's documents become does not depend on it.
    other = DocumentsConfig(
        bos_token=1, eos_token=2, strip_tokens="0,3", min_length=4, document_order="sequential"
    )
    assert other.decoration == documents.decoration
    assert hash(other.decoration) == hash(documents.decoration)
    from fmsdata.stages.documents import Decoration as from_stages

    assert from_stages is Decoration
