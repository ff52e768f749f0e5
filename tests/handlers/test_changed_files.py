"""Shards changing under a running loader: the message names the file, whether the change
is seen before a read (every access checks the mapped files), in a worker that a SIGBUS
kills, or in a process with 0 workers that it kills (the stack dump points to the list of
mapped files)."""

import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from formats import write_megatron_fmsdata
from support import take

from fmsdata import build_dataloader
from fmsdata.errors import ShardFormatError
from fmsdata.handlers import MegatronHandler, mapping, register_handler
from fmsdata.handlers.mapping import MappedFile

DOCS = [np.arange(100 * i + 5, 100 * i + 5 + 40 + i % 13, dtype=np.uint16) for i in range(400)]


def corpus(root):
    write_megatron_fmsdata(root, {"d": [DOCS[:200], DOCS[200:]]})
    return sorted(str(p) for p in (root / "d").glob("*.bin"))


def config(root, workers, **kw):
    return dict(
        data_path=str(root),
        file_type=kw.pop("file_type", "megatron"),
        seq_length=64,
        batch_size=2,
        logical_shards=1,
        shuffle_window=0,
        num_workers=workers,
        cache_dir=str(root / "cache"),
        **kw,
    )


def test_a_mapped_file_knows_it_changed(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(bytes(10_000))
    mapped = MappedFile(str(path))
    mapped.check_unchanged()
    os.truncate(path, 100)
    with pytest.raises(
        ShardFormatError, match=r"a\.bin: changed while being read \(size 10000 -> 100"
    ):
        mapped.check_unchanged()
    replaced = tmp_path / "b.bin"
    replaced.write_bytes(bytes(5))
    os.replace(replaced, path)  # a new file by rename: the mapping still reads the old one
    mapped.check_unchanged()
    mapped.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_shard_cut_between_opening_and_reading_is_named(tmp_path, workers):
    bins = corpus(tmp_path)
    loader = build_dataloader(config(tmp_path, workers))
    batches = iter(loader)
    next(batches)  # both files are open and mapped now
    for path in bins:
        os.truncate(path, 64)
    with pytest.raises(ShardFormatError, match=r"part_00[01]\.bin: changed while being read"):
        for _ in range(200):
            next(batches)


class CuttingHandler(MegatronHandler):
    """Cuts its own token file when the line writer asks for the tokens, after every check:
    the copy that follows faults (SIGBUS), as when another program truncates a shard in
    the middle of a read."""

    name = "cutting_megatron"

    def token_buffer(self, reader):
        buffer = super().token_buffer(reader)
        bin_path = reader.path[: -len(".idx")] + ".bin"
        copying = sys._getframe(1).f_code.co_name == "_pending"  # the line writer's call
        if copying and os.environ.get("FMSDATA_TEST_CUT") and os.path.getsize(bin_path) > 0:
            os.truncate(bin_path, 0)
        return buffer


def test_a_worker_killed_by_sigbus_is_reported_with_the_file(tmp_path, monkeypatch):
    register_handler(CuttingHandler)
    corpus(tmp_path)
    monkeypatch.setenv("FMSDATA_TEST_CUT", "1")
    loader = build_dataloader(config(tmp_path, 1, file_type="cutting_megatron"))
    with pytest.raises(
        ShardFormatError,
        match=r"part_00[01]\.bin: changed while being read .*a DataLoader worker died",
    ):
        take(loader, 5)


def test_zero_workers_sigbus_names_the_mapped_files(tmp_path):
    corpus(tmp_path)
    here = os.path.dirname(os.path.abspath(__file__))
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path[:0] = {[here, os.path.dirname(here)]!r}
        os.environ["FMSDATA_TEST_CUT"] = "1"
        from test_changed_files import CuttingHandler, config
        from fmsdata import build_dataloader, register_handler
        import pathlib
        register_handler(CuttingHandler)
        loader = build_dataloader(config(pathlib.Path({str(tmp_path)!r}), 0,
                                         file_type="cutting_megatron"))
        for _ in zip(range(5), loader):
            pass
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == -signal.SIGBUS
    assert "Fatal Python error: Bus error" in result.stderr
    # The dump points to the list of mapped files, written before any of them was read (the
    # newest names inline follow it when the note thread has run since: not waited for).
    note = re.search(
        r'File "<fmsdata: mapped shard files: \d+, all listed in ([^;]+);', result.stderr
    )
    assert note, result.stderr[-2000:]
    listed = mapping._read_list(note.group(1))
    os.unlink(note.group(1))
    assert any(re.search(r"part_00[01]\.bin$", name) for name, _ in listed.values())


def test_a_map_style_dataset_names_a_file_cut_after_opening(tmp_path):
    """Map-style readers stay open across reads: each read checks the files again (in a
    child process: a missed check kills the reader with SIGBUS)."""
    bins = corpus(tmp_path)
    here = os.path.dirname(os.path.abspath(__file__))
    script = textwrap.dedent(
        f"""
        import os, sys
        from fmsdata import get_dataset
        from fmsdata.errors import ShardFormatError
        dataset = get_dataset({str(tmp_path)!r}, 64, eos_token=2,
                              cache_dir={str(tmp_path / "cache")!r})
        first, last = dataset[0], dataset[len(dataset) - 1]  # both files open now
        for path in {bins!r}:
            os.truncate(path, 64)
        try:
            dataset[len(dataset) - 2]
        except ShardFormatError as err:
            print("refused:", err)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=here, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"refused: .*part_00[01]\.bin: changed while being read", result.stdout)
