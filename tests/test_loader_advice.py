"""Settings that run but are likely mistakes are said once, on rank 0, as a warning."""

import logging

import pytest
from support import base_config, corpus

from fmsdata import build_dataloader
from fmsdata.config import LoaderConfig
from fmsdata.loader import config_advice


@pytest.fixture
def info(tmp_path):
    return corpus(tmp_path / "data")


def advice(info, world_size=1, **overrides):
    return config_advice(LoaderConfig(**base_config(info, **overrides)), world_size)


def test_no_document_delimiter_is_warned(info):
    assert advice(info) == []
    said = advice(info, bos_token=None, eos_token=None)
    assert len(said) == 1 and "neither bos_token nor eos_token is set" in said[0]
    assert advice(info, bos_token=None) == [] and advice(info, eos_token=None) == []


@pytest.mark.parametrize(
    "world_size, batch_size, logical_shards, warned",
    [(1, 4, 4, False), (2, 2, 4, False), (2, 4, 4, False), (1, 3, 4, True), (3, 2, 4, True)],
)
def test_a_global_batch_off_the_logical_shards_is_warned(
    info, world_size, batch_size, logical_shards, warned
):
    said = advice(info, world_size, batch_size=batch_size, logical_shards=logical_shards)
    assert bool(said) == warned
    if warned:
        assert f"not a multiple of logical_shards={logical_shards}" in said[0]
        assert f"{world_size} x {batch_size} = {world_size * batch_size} is" in said[0]


@pytest.mark.parametrize(
    "world_size, batch_size, logical_shards, fix",
    [(1, 3, 4, 4), (3, 2, 4, 4), (1, 8, 64, 64), (2, 5, 8, 8), (6, 1, 4, 2), (4, 3, 64, 16)],
)
def test_the_warning_is_one_short_line_naming_a_batch_size_that_fits(
    info, world_size, batch_size, logical_shards, fix
):
    (said,) = advice(info, world_size, batch_size=batch_size, logical_shards=logical_shards)
    assert "\n" not in said and len(said) <= 160
    assert said.endswith(f"use batch_size={fix} or fewer logical_shards")
    assert (world_size * fix) % logical_shards == 0
    assert advice(info, world_size, batch_size=fix, logical_shards=logical_shards) == []


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_the_default_config_follows_the_advice(info, world_size):
    config = LoaderConfig(data_path=info.root, datasets=list(info.ranges), bos_token=1)
    assert config_advice(config, world_size) == []


def test_advice_reaches_the_log_once_from_rank_zero(info, caplog):
    config = base_config(info, bos_token=None, eos_token=None, batch_size=3)
    with caplog.at_level(logging.WARNING, logger="fmsdata"):
        build_dataloader(config, rank=0, world_size=2)
        build_dataloader(config, rank=1, world_size=2)
    assert caplog.text.count("neither bos_token nor eos_token") == 1
    assert caplog.text.count("not a multiple of logical_shards") == 1
