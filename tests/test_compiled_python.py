"""The kernels run as Python (what a fresh process serves its first batches with while numba
compiles, ``fmsdata.util.compiled``) give the same batches as the compiled kernels: pipelines
over a range of configurations, fresh and resumed, with and without DataLoader workers,
compared tensor for tensor; every kernel the package defines is run both ways by them."""

import os
import subprocess
import sys

import numpy as np
import pytest
from support import assert_same_batches, base_config, corpus, take

from fmsdata import build_dataloader
from fmsdata.util import compiled
from fmsdata.util.compiled import compiled as compiled_decorator

CONFIGS = {
    "default, a long run": {"batches": 80},
    "two workers": {"num_workers": 2},
    "pad, positions, document ids": {
        "packing": "pad",
        "pad_token": 5,
        "return_position_ids": True,
        "return_document_ids": True,
    },
    "best_fit, cu_seqlens": {
        "packing": "best_fit",
        "pad_token": 5,
        "pack_window": 9,
        "return_cu_seqlens": True,
    },
    "weight schedule": {"weights": None, "weight_schedule": [[0, [1.0, 1.0]], [400, [1.0, 4.0]]]},
    "no shuffle, uint16 tokens": {"shuffle_window": 0},
}
BATCHES = 12


def run(config, mode, batches=BATCHES):
    """Batches of a fresh loader, then of one resumed from its state, with kernels served
    as ``mode``."""
    compiled._set_mode(mode)
    try:
        first = build_dataloader(config)
        out = take(first, batches)
        resumed = build_dataloader(config)
        resumed.load_state_dict(first.state_dict())
        return out + take(resumed, batches)
    finally:
        compiled._set_mode(None)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("compiled")
    wide = corpus(base / "wide", docs_per_file=30, mean_length=30)
    narrow = corpus(base / "narrow", docs_per_file=30, mean_length=30, dtype=np.uint16)
    return wide, narrow


def test_kernels_as_python_give_the_compiled_batches(roots, monkeypatch):
    ran = set()
    python = compiled._Compiled.python

    def recorded(self, *args):
        ran.add((self.__module__, self.__qualname__))
        return python(self, *args)

    monkeypatch.setattr(compiled._Compiled, "python", recorded)
    wide, narrow = roots
    for name, overrides in CONFIGS.items():
        info = narrow if "uint16" in name else wide
        overrides = dict(overrides)
        batches = overrides.pop("batches", BATCHES)
        config = base_config(info, **overrides)
        assert_same_batches(run(config, "foreground", batches), run(config, "python", batches))
    # Every kernel was run as Python by these pipelines (in this process: the workers'
    # runs are the zero-worker ones' kernels again, in other processes).
    defined = {(k.__module__, k.__qualname__) for k in compiled.kernels()}
    defined = {k for k in defined if k[0].startswith("fmsdata.")}  # not this file's own
    assert defined - ran == set()


@compiled_decorator
def _wrapping_sum(values):
    total = np.uint64(0)
    for i in range(values.shape[0]):
        total = total * np.uint64(0x9E3779B97F4A7C15) + np.uint64(values[i])
    return total


@compiled_decorator
def _calls_a_helper(values):
    return _wrapping_sum(values) ^ np.uint64(1)


def test_a_first_call_runs_in_python_and_later_ones_compiled():
    values = np.arange(1000, dtype=np.int64)
    compiled._set_mode("background")
    try:
        first = _calls_a_helper(values)  # Python (the compile is handed to the thread)
        compiled._background.busy.acquire()  # waits for the compile in progress, if any
        compiled._background.busy.release()
        for _ in range(200):
            if _calls_a_helper.ready is not None:
                break
            import time

            time.sleep(0.05)
        assert _calls_a_helper.ready is not None
        assert _calls_a_helper(values) == first  # compiled now: the same wrapping result
        compiled._set_mode("python")
        assert _calls_a_helper(values) == first
    finally:
        compiled._set_mode(None)


FORKED = r"""
import os, numpy as np
from fmsdata.util import compiled
from fmsdata.util.permute import Permutations
compiled._set_mode("background")
# hand a compile to the thread, then fork while it may be compiling
Permutations([10, 20], [1, 2]).apply(np.arange(5), np.zeros(5, dtype=np.int64))
pid = os.fork()
if pid == 0:
    out = Permutations([10, 20], [1, 2]).apply(np.arange(5), np.zeros(5, dtype=np.int64))
    os._exit(0 if sorted(out.tolist()) == sorted(set(out.tolist())) else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_fork_during_a_background_compile_leaves_the_child_working(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}  # empty: the compile takes time
    done = subprocess.run(
        [sys.executable, "-c", FORKED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_an_unknown_mode_is_a_warning_and_the_default(caplog, monkeypatch):
    monkeypatch.setenv("FMSDATA_COMPILE", "eventually")
    try:
        compiled._set_mode(None)
        assert compiled.compile_mode() == "background"
    finally:
        monkeypatch.delenv("FMSDATA_COMPILE")
        compiled._set_mode(None)
    assert "FMSDATA_COMPILE='eventually' is not one of" in caplog.text


COLD = r"""
import hashlib, json, sys
from fmsdata import build_dataloader
config = json.loads(sys.argv[1])
digest = hashlib.sha256()
for step, batch in enumerate(build_dataloader(config), 1):
    for key in sorted(batch):
        digest.update(batch[key].numpy().tobytes())
    if step == 60:
        break
print(digest.hexdigest())
"""


@pytest.mark.slow  # compiles every kernel from an empty cache, twice
@pytest.mark.parametrize("workers", [0, 2])
def test_a_fresh_process_with_an_empty_cache_gives_the_same_batches(roots, tmp_path, workers):
    """Background mode switches from Python to compiled kernels part way (the cache is
    empty, so the compile takes seconds); its batches equal a foreground run's."""
    import json

    wide, _ = roots
    config = json.dumps(base_config(wide, num_workers=workers, return_position_ids=True))
    digests = {}
    for mode in ("background", "foreground"):
        env = {**os.environ, "FMSDATA_COMPILE": mode}
        env["NUMBA_CACHE_DIR"] = str(tmp_path / mode)
        done = subprocess.run(
            [sys.executable, "-c", COLD, config],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        digests[mode] = done.stdout.strip()
    assert digests["background"] == digests["foreground"]


def cache_files(folder):
    return sorted(
        os.path.relpath(os.path.join(parent, name), folder)
        for parent, _, names in os.walk(folder)
        for name in names
    )


@pytest.mark.slow  # compiles the kernels of a config from an empty cache
def test_after_fmsdata_warm_a_run_of_its_config_compiles_nothing(roots, tmp_path):
    """``fmsdata warm CONFIG`` compiles what CONFIG's runs use, with and without workers,
    well past the shuffle buffers' fill: a run of 200 batches then writes nothing more to
    the cache (it would for the kernels that only a buffer's compaction calls)."""
    import yaml

    wide, _ = roots
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base_config(wide, num_workers=1)))
    cache = tmp_path / "numba"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "fmsdata.cli.main", "warm", str(path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "kernel(s) compiled into the cache" in done.stderr
    warmed = cache_files(cache)
    assert any(name.endswith(".nbi") for name in warmed)
    run_it = "\n".join(
        [
            "import sys",
            "from fmsdata import build_dataloader",
            "from fmsdata.config import LoaderConfig",
            "config = LoaderConfig.from_yaml(sys.argv[1])",
            "for workers in (0, 1):",
            "    loader = build_dataloader(config.replace(num_workers=workers))",
            "    for step, _ in enumerate(loader, 1):",
            "        if step == 200:",
            "            break",
        ]
    )
    env["FMSDATA_COMPILE"] = "foreground"
    done = subprocess.run(
        [sys.executable, "-c", run_it, str(path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert cache_files(cache) == warmed


def test_the_compile_queue_types_arrays_by_small_proxies():
    """What the background thread compiles for is typed as the arguments (numba's typeof),
    from proxies that hold none of their buffers."""
    import numba

    from fmsdata.util.compiled import _type_proxy

    base = np.arange(60, dtype=np.uint16).reshape(3, 4, 5)
    readonly = np.arange(6)
    readonly.setflags(write=False)
    values = [
        base,
        np.asfortranarray(base),
        base[:, ::2],
        base[0, :, 1],
        readonly,
        np.zeros((), dtype=np.float32),
        np.uint64(7),
        3,
        True,
        (np.arange(3), np.arange(4.0)),
    ]
    for value in values:
        proxy = _type_proxy(value)
        assert numba.typeof(proxy) == numba.typeof(value), value
        if isinstance(value, np.ndarray) and value.size > 8:
            assert proxy.size < value.size and not np.shares_memory(proxy, value)
