"""G8: bad input gets a typed error that names what is wrong.

What the config alone shows is refused when the loader is built; what the data shows, at
its first use (building it reads only the root's ``metadata.json``).
"""

import os

import pytest
from support import base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.errors import ConfigError, EmptyDatasetError, ShardFormatError, StateMismatchError
from fmsdata.state.file import state_to_bytes


def test_missing_data_path(tmp_path):
    missing = str(tmp_path / "nowhere")
    loader = build_dataloader({"data_path": missing, "seq_length": 8})
    with pytest.raises(ConfigError, match="nowhere.*does not exist"):
        iter(loader)


def test_missing_dataset_folder_lists_what_exists(tmp_path):
    info = corpus(tmp_path)
    loader = build_dataloader(base_config(info, datasets=["a", "c"]))
    with pytest.raises(ConfigError, match=r"dataset 'c' is not a folder.*\['a', 'b'\]"):
        loader.state_dict()


def test_dataset_without_shards(tmp_path):
    info = corpus(tmp_path)
    os.makedirs(tmp_path / "empty")
    (tmp_path / "empty" / "README.txt").write_text("no shards here")
    loader = build_dataloader(base_config(info, datasets=["a", "empty"]))
    with pytest.raises(EmptyDatasetError, match=r"'empty'.*no arrow shard"):
        loader.steps  # noqa: B018 (its first use)


def test_truncated_shard_names_the_file(tmp_path):
    info = corpus(tmp_path)
    victim = tmp_path / "a" / "shard_00001.arrow"
    victim.write_bytes(victim.read_bytes()[:300])
    loader = build_dataloader(base_config(info, logical_shards=1, num_workers=0))
    with pytest.raises(ShardFormatError, match="shard_00001.arrow"):
        take(loader, 30)


@pytest.mark.parametrize("workers", [1, 2])
def test_truncated_shard_error_crosses_the_worker_boundary(tmp_path, workers):
    """The worker's error reaches the main process as it was made: the same class, its
    one-line message naming the file, not PyTorch's rebuilt copy that carries the worker's
    traceback in its message; the traceback is kept as a note."""
    info = corpus(tmp_path)
    victim = tmp_path / "b" / "shard_00000.arrow"
    victim.write_bytes(victim.read_bytes()[:-40])
    loader = build_dataloader(base_config(info, logical_shards=2, num_workers=workers))
    with pytest.raises(ShardFormatError) as caught:
        take(loader, 30)
    error = caught.value
    assert type(error) is ShardFormatError
    assert str(error).startswith(f"{victim}: ") and "\n" not in str(error)
    assert "Caught" not in str(error)
    assert any("DataLoader worker process" in note for note in error.__notes__)


def test_wrong_column_names_file_and_columns(tmp_path):
    info = corpus(tmp_path)
    loader = build_dataloader(base_config(info, col_name="input_ids"))
    with pytest.raises(
        ShardFormatError, match=r"no token column 'input_ids'; columns are \['tokens'\]"
    ):
        take(loader, 1)


def test_fewer_logical_shards_than_ranks(tmp_path):
    info = corpus(tmp_path)
    with pytest.raises(ConfigError, match="logical_shards=2 is fewer than world_size=4"):
        build_dataloader(base_config(info, logical_shards=2), rank=0, world_size=4)


def test_token_outside_the_vocabulary(tmp_path):
    info = corpus(tmp_path)
    loader = build_dataloader(base_config(info, vocab_size=100))
    with pytest.raises(
        ShardFormatError,
        match=r"shard_\d+\.arrow: document \d+ holds token id \d+, outside vocab_size=100",
    ):
        take(loader, 1)


def test_state_from_another_seed_is_refused_naming_the_field(tmp_path):
    info = corpus(tmp_path)
    loader = build_dataloader(base_config(info, seed=1))
    take(loader, 2)
    other = build_dataloader(base_config(info, seed=2))
    with pytest.raises(StateMismatchError, match="seed=1 but this loader has seed=2"):
        other.load_state_dict(loader.state_dict())


def test_state_from_other_data_is_refused(tmp_path):
    one = corpus(tmp_path / "one")
    two = corpus(tmp_path / "two", docs_per_file=25)
    loader = build_dataloader(base_config(one))
    take(loader, 1)
    with pytest.raises(StateMismatchError, match="data="):
        build_dataloader(base_config(two)).load_state_dict(loader.state_dict())


def test_intended_change_can_be_allowed(tmp_path):
    info = corpus(tmp_path)
    loader = build_dataloader(base_config(info, shuffle_window=6))
    take(loader, 2)
    other = build_dataloader(base_config(info, shuffle_window=6, min_length=2))
    with pytest.raises(StateMismatchError, match="min_length"):
        other.load_state_dict(loader.state_dict())
    other.load_state_dict(loader.state_dict(), allow_changes=["min_length"])
    # Loaded: it continues from the saved position (the shards' states are the saved ones).
    assert other.steps == 2
    saved = {e["id"]: state_to_bytes(e["state"]) for e in loader.snapshot()["shards"]}
    assert {e["id"]: state_to_bytes(e["state"]) for e in other.snapshot()["shards"]} == saved
    assert len(take(other, 2)) == 2


def test_garbage_state_is_refused(tmp_path):
    info = corpus(tmp_path)
    loader = build_dataloader(base_config(info))
    with pytest.raises(StateMismatchError, match="lacks"):
        loader.load_state_dict({"version": 1})
    state = loader.snapshot()
    state["version"] = 99
    with pytest.raises(StateMismatchError, match="version=99"):
        loader.load_state_dict(state)


@pytest.mark.parametrize(
    "field, saved, now",
    [("seq_length", 16, 32), ("shuffle_window", 6, 4), ("eos_token", 2, 3)],
)
def test_state_from_another_config_names_the_config_field(tmp_path, field, saved, now):
    """Stages record config fields under their own names (the packer's capacity is
    seq_length + 1): the refusal names the config field and both of its values."""
    info = corpus(tmp_path)
    loader = build_dataloader(base_config(info, **{field: saved}))
    take(loader, 2)
    other = build_dataloader(base_config(info, **{field: now}))
    with pytest.raises(StateMismatchError) as caught:
        other.load_state_dict(loader.state_dict())
    assert str(caught.value).startswith(
        f"the state was saved with {field}={saved} but this loader has {field}={now}"
    )
