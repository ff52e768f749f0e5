"""The config is a low layer, and each layer above takes its section whole."""

import ast
import os

import pytest

from fmsdata import LoaderConfig
from fmsdata.config import DataConfig, FimConfig, RemoteConfig
from fmsdata.data.dataformat import handler_for
from fmsdata.handlers import ArrowDocHandler, FlatTokensHandler
from fmsdata.remote.storage import Storage
from fmsdata.stages.shard import ShardRecipe

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def imported_modules(folder):
    """Every ``fmsdata...`` module imported by the Python files under ``folder``."""
    found = {}
    for base, _, files in os.walk(os.path.join(REPO, folder)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(base, name)
                with open(path, encoding="utf-8") as handle:
                    tree = ast.parse(handle.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.ImportFrom) and node.module:
                        found.setdefault(node.module, []).append(path)
                    elif isinstance(node, ast.Import):
                        for alias in node.names:
                            found.setdefault(alias.name, []).append(path)
    return {m: paths for m, paths in found.items() if m.split(".")[0] == "fmsdata"}


# What the config layer may use below it: the errors and the lowest layer's helpers (which
# values are URLs, the bundled tokenizers' names).
BELOW_THE_CONFIG = {"fmsdata.errors", "fmsdata.util.urls", "fmsdata.util.textcorpus"}


def test_the_config_imports_only_itself_and_the_layer_below():
    outside = {
        module
        for module in imported_modules("fmsdata/config")
        if not module.startswith("fmsdata.config") and module not in BELOW_THE_CONFIG
    }
    assert outside == set()


def test_the_handlers_do_not_know_the_config():
    modules = imported_modules("handlers")
    assert not [m for m in modules if m.startswith("fmsdata.config")], modules


@pytest.mark.parametrize("path", ["fmsdata/data/access.py", "fmsdata/worker/materialize.py"])
def test_decoration_comes_from_the_config_layer(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    sources = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and any(a.name == "Decoration" for a in node.names)
    ]
    assert sources == ["fmsdata.config"]


def test_handler_for_takes_the_data_section():
    handler = handler_for(DataConfig(data_path="/d", col_name="ids,tokens"))
    assert isinstance(handler, ArrowDocHandler)  # the default format
    assert handler.describe() == {"file_type": "arrow", "col_name": "ids,tokens"}
    flat = handler_for(DataConfig(data_path="/d", file_type="npy", token_dtype="uint16"), 5)
    assert isinstance(flat, FlatTokensHandler)
    assert flat.separator == 5  # no doc_separator: the documents' EOS splits them
    chosen = DataConfig(data_path="/d", file_type="npy", doc_separator=3)
    assert handler_for(chosen, 5).separator == 3


def test_storage_takes_the_remote_section():
    remote = RemoteConfig(
        endpoint_url="http://127.0.0.1:9",
        aws_profile="p",
        anonymous=True,
        storage_options={"k": 1},
        remote_retries=3,
        remote_backoff=0.25,
    )
    storage = Storage.from_config(remote)
    assert (storage.endpoint_url, storage.profile, storage.anonymous) == (
        "http://127.0.0.1:9",
        "p",
        True,
    )
    assert storage.options == {"k": 1}
    assert (storage.retry.tries, storage.retry.backoff) == (3, 0.25)


def test_the_shard_recipe_holds_the_line_shaping_sections():
    config = LoaderConfig(
        data_path="/d",
        seq_length=16,
        bol_token=1,
        bos_token=2,
        eos_token=3,
        strip_tokens="3",
        logical_shards=4,
        seed=9,
        shuffle_window=5,
        fim_training=True,
        psm_rate=0.5,
        fim_pre=10,
    )
    recipe = ShardRecipe.from_config(config, ["a"])
    assert recipe.lines is config.lines and recipe.documents is config.documents
    assert recipe.fim is config.fim and isinstance(recipe.fim, FimConfig)
    assert (recipe.seed, recipe.n_shards, recipe.capacity, recipe.window) == (9, 4, 16, 5)
    assert recipe.decoration == config.documents.decoration
    assert recipe.frame == (1, 2, 3)  # BOL, BOS, EOS (no EOL)
    sequential = ShardRecipe.from_config(config.replace(document_order="sequential"), ["a"])
    assert sequential.window == 0
    assert ShardRecipe.from_config(config.replace(fim_training=False), ["a"]).fim is None
