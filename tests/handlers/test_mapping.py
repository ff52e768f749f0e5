"""The list of mapped files a process keeps for its own death (handlers/mapping.py): one
line per file mapped or closed, rewritten once mostly closed lines, so what a process
writes grows with the files it opens, not with files opened x files open; read back it
gives exactly the open mappings; a reader cache sees only the mappings its open made."""

import gc
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from fmsdata.data.access import ReaderCache
from fmsdata.handlers import fault_note, mapping
from fmsdata.handlers.mapping import MappedFile


@pytest.fixture
def listing(monkeypatch):
    """This process keeps its list as a DataLoader worker does; removed afterwards."""
    monkeypatch.setattr(mapping, "_in_worker", lambda: True)
    monkeypatch.setattr(mapping, "_journal", None)
    written = {"lines": 0}
    add, rewrite = mapping._Journal.add, mapping._Journal.rewrite

    def counted_add(self, line):
        written["lines"] += 1
        add(self, line)

    def counted_rewrite(self):
        written["lines"] += len(mapping._OPEN) + 1
        rewrite(self)

    monkeypatch.setattr(mapping._Journal, "add", counted_add)
    monkeypatch.setattr(mapping._Journal, "rewrite", counted_rewrite)
    yield written
    journal = mapping._journal
    if journal is not None and journal.fd >= 0:
        os.close(journal.fd)
    mapping.forget_worker_lists([os.getpid()])


def files(tmp_path, n):
    paths = []
    for i in range(n):
        path = tmp_path / f"part_{i:04d}.bin"
        path.write_bytes(bytes([i % 256]) * 16)
        paths.append(str(path))
    return paths


def test_the_list_grows_with_files_opened_not_with_files_open(tmp_path, listing):
    paths = files(tmp_path, 600)
    maps = [MappedFile(p) for p in paths]  # 600 open at once
    for m in maps[::2]:
        m.close()
    # Rewriting the whole list at each open would write 600 * 601 / 2 = 180,300 lines.
    assert listing["lines"] <= 3 * 900 + 64
    listed = mapping._read_list(mapping.list_path(os.getpid()))
    assert sorted(name for name, _ in listed.values()) == sorted(paths[1::2])
    for m in maps[1::2]:
        m.close()


def test_a_dead_process_list_names_the_open_file_that_changed(tmp_path, listing):
    paths = files(tmp_path, 5)
    maps = [MappedFile(p) for p in paths]
    maps[0].close()
    os.truncate(paths[0], 1)  # closed: not named
    os.truncate(paths[3], 1)
    found = mapping.changed_in_dead_workers([os.getpid()])
    assert len(found) == 1 and found[0].startswith(f"{paths[3]}: changed while being read")
    assert not os.path.exists(mapping.list_path(os.getpid()))  # read once, then removed
    for m in maps[1:]:
        m.close()


def test_a_mapping_dropped_without_close_leaves_the_list(tmp_path, listing):
    kept, dropped = files(tmp_path, 2)
    other, mapped = MappedFile(kept), MappedFile(dropped)
    assert dropped in mapping.mapped_paths()
    del mapped
    assert dropped not in mapping.mapped_paths()
    listed = mapping._read_list(mapping.list_path(os.getpid()))
    assert [name for name, _ in listed.values()].count(dropped) == 0
    assert kept in [name for name, _ in listed.values()]
    other.close()
    if not mapping._OPEN:  # nothing mapped: no list left behind for a killed worker
        assert not os.path.exists(mapping.list_path(os.getpid()))


def test_a_closed_mapping_stays_listed_while_an_array_views_it(tmp_path, listing):
    """A worker copies an item's pieces from token buffers it holds while their readers
    may be evicted and closed: the file stays mapped until its last view goes, and a fault
    reading it meanwhile must find it in the list."""
    kept, closed = files(tmp_path, 2)
    other, mapped = MappedFile(kept), MappedFile(closed)
    view = mapped.view(np.dtype(np.uint16))
    mapped.close()
    listed = mapping._read_list(mapping.list_path(os.getpid()))
    assert closed in mapping.mapped_paths()
    assert closed in [name for name, _ in listed.values()]
    del view
    assert closed not in mapping.mapped_paths()
    listed = mapping._read_list(mapping.list_path(os.getpid()))
    assert [name for name, _ in listed.values()] == [kept]
    other.close()


def test_a_reader_cache_keeps_only_the_mappings_of_its_own_open(tmp_path):
    paths = files(tmp_path, 3)

    class Handler:
        def open(self, path):
            return MappedFile(path)

        def close(self, reader):
            reader.close()

    other = MappedFile(paths[0])  # mapped by someone else: not this cache's to check
    cache = ReaderCache(2)
    reader = cache.get("a", Handler(), lambda: paths[1])
    assert cache._mapped["a"] == [reader]
    cache.close()
    other.close()


def test_the_note_names_the_list_before_the_newest_files():
    name = fault_note._name(840, "/tmp/fmsdata-maps-7.tsv", ["/d/b.npy", "/d/a.npy"])
    assert name == (
        "<fmsdata: mapped shard files: 840, all listed in /tmp/fmsdata-maps-7.tsv; "
        "newest: /d/b.npy, /d/a.npy>"
    )
    assert len(name) < 500  # faulthandler prints the first 500 characters


def test_a_mapping_collected_while_the_list_is_written_is_forgotten_after(
    tmp_path, listing, monkeypatch
):
    """A mapping dropped inside a reference cycle is freed by the garbage collector, which
    can run inside any allocation: also while this process writes out its list. Its
    finalizer then only queues it, and the next change of the list forgets it (it used to
    change the list under the writer: 'dictionary changed size during iteration')."""

    class CollectedMidway(dict):
        """The open mappings, with a garbage collection in the middle of every listing."""

        def items(self):
            for i, item in enumerate(super().items()):
                if i == 1:
                    gc.collect()
                yield item

    monkeypatch.setattr(mapping, "_OPEN", CollectedMidway(mapping._OPEN))
    paths = files(tmp_path, 20)
    kept = [MappedFile(p) for p in paths[:10]]
    for path in paths[10:]:
        cycle = [MappedFile(path)]
        cycle.append(cycle)  # only the collector frees it
        del cycle
        mapping.publish()  # lists every mapping: the collection runs inside
    gc.collect()
    assert sorted(mapping.mapped_paths()) == sorted(paths[:10])
    listed = mapping._read_list(mapping.list_path(os.getpid()))
    assert sorted(name for name, _ in listed.values()) == sorted(paths[:10])
    for m in kept:
        m.close()


def test_lists_of_mapped_files_of_dead_processes_are_swept(tmp_path):
    """A killed job leaves its workers' mapped-file lists in the temp folder; the next
    process to start one removes those of dead processes once they are old."""
    dead = []
    for _ in range(2):
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()
        dead.append(child.pid)
    old, fresh = (mapping.list_path(p) for p in dead)
    mine = mapping.list_path(os.getpid())
    for path in (old, fresh, mine):
        with open(path, "w") as out:
            out.write("# test\n")
    long_ago = time.time() - 2 * mapping.STALE_LIST_S
    os.utime(old, (long_ago, long_ago))
    os.utime(mine, (long_ago, long_ago))
    try:
        gone = mapping.sweep_stale_lists()
        assert dead[0] in gone
        assert not os.path.exists(old)
        assert os.path.exists(fresh), "a dead worker's list is kept while its main may read it"
        assert os.path.exists(mine), "a live process's list is kept"
    finally:
        mapping.forget_worker_lists(dead + [os.getpid()])
