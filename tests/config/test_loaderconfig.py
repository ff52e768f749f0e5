import dataclasses
import re

import pytest
import yaml

from fmsdata import LoaderConfig
from fmsdata.config import SECTIONS, as_config
from fmsdata.errors import ConfigError


def test_fms_fsdp_style_comma_strings():
    config = LoaderConfig(
        data_path="/d", datasets="web, code", weights="0.7,0.3", strip_tokens="0,1"
    )
    assert config.datasets == ("web", "code")
    assert config.weights == (0.7, 0.3)
    assert config.strip_tokens == (0, 1)


def test_col_name_takes_candidate_columns():
    assert LoaderConfig(data_path="/d", col_name=" text, tokens ").col_name == "text,tokens"
    assert LoaderConfig(data_path="/d", col_name=["a", "b"]).col_name == "a,b"
    for bad in ("", ",", None, 5):
        with pytest.raises(ConfigError, match="col_name"):
            LoaderConfig(data_path="/d", col_name=bad)
    with pytest.raises(ConfigError, match="batch_format must be one of"):
        LoaderConfig(data_path="/d", batch_format="list")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"seq_length": 0}, "seq_length must be a positive integer, got 0"),
        ({"seq_length": "long"}, "seq_length must be an integer, got 'long'"),
        ({"remote_backoff": "soon"}, "remote_backoff must be a number, got 'soon'"),
        ({"batch_size": -2}, "batch_size must be a positive integer, got -2"),
        ({"datasets": "a", "weights": "1,2"}, "weights has 2 entries but datasets has 1"),
        ({"weights": "1,2"}, "weights needs datasets"),
        ({"datasets": "a,b", "weights": "1,-1"}, "weights must be non-negative"),
        ({"datasets": "a,b", "weights": "0,0"}, "with one positive"),
        ({"datasets": "a", "weight_schedule": [[5, [1]], [5, [2]]]}, "positions must increase"),
        (
            {"datasets": "a", "weight_schedule": [[0, [1]]], "schedule_unit": "steps"},
            "needs global_batch_size",
        ),
        ({"datasets": "a", "weights": "1", "weight_schedule": [[0, [1]]]}, "not both"),
        ({"schedule_interpolation": "cubic"}, "schedule_interpolation"),
        ({"datasets": "a,a"}, "lists a folder twice"),
        ({"packing": "tight"}, "packing must be one of"),
        ({"packing": "pad"}, "needs pad_token"),
        ({"bos_token": -1}, "bos_token must be a non-negative token id"),
        ({"vocab_size": 10, "eos_token": 10}, "eos_token=10 is outside vocab_size=10"),
        ({"seq_length": 1, "bol_token": 1, "eol_token": 2}, "leaves no room"),
        ({"multiprocessing_context": "threads"}, "multiprocessing_context"),
        ({"shuffle_window": -1}, "shuffle_window must be a non-negative integer"),
        ({"pin_memory": "yes"}, "pin_memory must be true or false"),
        ({"output_dtype": "int16"}, "output_dtype must be one of"),
        ({"output_dtype": "int32", "return_document_ids": True}, "return_document_ids needs"),
        ({"ignore_first_labels": -1}, "ignore_first_labels must be an integer from 0"),
        ({"seq_length": 8, "ignore_first_labels": 9}, r"from 0 to seq_length \(8\), got 9"),
    ],
)
def test_invalid_values_name_field_and_value(changes, message):
    with pytest.raises(ConfigError, match=message):
        LoaderConfig(data_path="/d", **changes)


def test_numeric_fields_refuse_by_name_and_grammatically():
    numeric = [
        f.name
        for section in SECTIONS.values()
        for f in dataclasses.fields(section)
        if f.type in ("int", "float", "int | None", "float | None")
    ]
    assert "seq_length" in numeric and "remote_backoff" in numeric
    for name in numeric:
        # A value is taken, or refused by a ConfigError naming the field and the value;
        # never an untyped error (int("inf") raises OverflowError).
        for bad in ("many", float("inf"), "inf", float("nan")):
            try:
                LoaderConfig(data_path="/d", **{name: bad})
            except ConfigError as caught:
                message = str(caught)
                assert name in message and repr(bad) in message, message
                assert " a int" not in message and " a float" not in message
            except Exception as other:  # an untyped error: the class this test guards
                raise AssertionError(f"{name}={bad!r} raised {other!r}") from None


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ConfigError, match=r"unknown config field\(s\): 'seq_len' \(did you mean"):
        LoaderConfig.from_dict({"data_path": "/d", "seq_len": 5})
    with pytest.raises(ConfigError, match="data_path is required"):
        LoaderConfig.from_dict({"seq_length": 5})


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {"data": {"data_path": "/d", "datasets": "a,b", "weights": [1, 3], "seq_length": 128}}
        )
    )
    config = LoaderConfig.from_yaml(path, ["seq_length=256", "bos_token=1", "datasets=a,b"])
    assert config.seq_length == 256 and config.bos_token == 1 and config.weights == (1.0, 3.0)
    assert as_config(str(path)).seq_length == 128
    assert config.with_overrides(["shuffle_window=0"]).shuffle_window == 0
    with pytest.raises(ConfigError, match="key=value"):
        config.with_overrides(["shuffle_window"])
    assert LoaderConfig.from_dict(config.to_dict()) == config


def test_bad_yaml_is_a_config_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data_path: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        LoaderConfig.from_yaml(path)


def test_derived_lengths():
    config = LoaderConfig(data_path="/d", seq_length=100, bol_token=1, eol_token=2)
    assert config.line_length == 101 and config.content_capacity == 99


@pytest.mark.parametrize(
    "typo, meant",
    [("seq_len", "seq_length"), ("batchsize", "batch_size"), ("logical_shard", "logical_shards")],
)
def test_unknown_field_names_the_close_match(typo, meant):
    with pytest.raises(ConfigError, match=rf"{typo!r} \(did you mean {meant!r}\?\)"):
        LoaderConfig.from_dict({"data_path": "/d", typo: 5})
    config = LoaderConfig(data_path="/d")
    with pytest.raises(ConfigError, match=rf"in overrides: {typo!r} \(did you mean {meant!r}"):
        config.with_overrides([f"{typo}=5"])
    with pytest.raises(ConfigError) as caught:
        LoaderConfig.from_dict({"data_path": "/d", "zzzz": 5})
    assert "did you mean" not in str(caught.value)


@pytest.mark.parametrize(
    "text, shown",
    [("- data_path: /d\n- seq_length: 8\n", "a list"), ("just words\n", "a str"), ("", "empty")],
)
def test_yaml_that_is_not_a_mapping_is_a_config_error(tmp_path, text, shown):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        LoaderConfig.from_yaml(path)
    message = str(caught.value)
    assert str(path) in message and shown in message and "data_path: /data/root" in message


@pytest.mark.parametrize("field", ["tokenizer", "cache_dir", "checkpoint_dir"])
@pytest.mark.parametrize("value", [5, 1.5, True, ["a"], {"a": 1}, ""])
def test_path_fields_must_be_paths(field, value):
    with pytest.raises(
        ConfigError, match=rf"{field} must be a path .*got {re.escape(repr(value))}"
    ):
        LoaderConfig(data_path="/d", **{field: value})


@pytest.mark.parametrize("field", ["col_name", "text_field"])
def test_name_fields_must_be_names(field):
    with pytest.raises(ConfigError, match=rf"{field} must be .*got 5"):
        LoaderConfig(data_path="/d", **{field: 5})


def test_a_tokenizer_field_that_is_not_a_tokenizer_names_file_and_field(tmp_path):
    from fmsdata import build_dataloader

    bogus = tmp_path / "tok.json"
    bogus.write_bytes(bytes(range(256)))  # "stream did not contain valid UTF-8"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text('{"text": "hello"}\n')
    config = dict(
        data_path=str(tmp_path),
        file_type="jsonl",
        tokenizer=str(bogus),
        seq_length=8,
        batch_size=1,
        logical_shards=1,
        num_workers=0,
        cache_dir=str(tmp_path / "c"),
    )
    with pytest.raises(ConfigError, match=r"tokenizer '.*tok\.json' is not a tokenizers"):
        next(iter(build_dataloader(config)))
    bogus.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ConfigError, match=r"tokenizer '.*tok\.json' is not a tokenizers"):
        next(iter(build_dataloader(config)))
