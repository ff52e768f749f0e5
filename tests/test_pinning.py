"""Pinned batches are assembled on a side thread and change nothing else (G1 with pinning)."""

import threading

import pytest
import torch
from support import (
    EOL,
    assert_same_batches,
    base_config,
    check_resume,
    corpus,
    roundtrip,
    small_items,
    take,
)

import fmsdata.loader.dataloader
import fmsdata.transport.batchring
from fmsdata import build_dataloader
from fmsdata.errors import ConfigError


def pinned_config(info, **overrides):
    return base_config(
        info, eol_token=EOL, return_position_ids=True, return_cu_seqlens=True, **overrides
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pinning_changes_no_batch_and_resumes_exactly(tmp_path, num_workers):
    info = corpus(tmp_path)
    plain = take(build_dataloader(pinned_config(info, num_workers=num_workers)), 40)
    config = pinned_config(info, num_workers=num_workers, pin_memory=True)
    assert_same_batches(plain, take(build_dataloader(config), 40))
    check_resume(lambda: build_dataloader(config), total=40, points=[9, 31])


def test_batches_are_assembled_off_the_training_thread(tmp_path, monkeypatch):
    info = corpus(tmp_path)
    threads = set()
    assemble = fmsdata.loader.dataloader.assemble_batch

    def recording(*args, **kwargs):
        threads.add(threading.get_ident())
        return assemble(*args, **kwargs)

    monkeypatch.setattr(fmsdata.loader.dataloader, "assemble_batch", recording)
    take(build_dataloader(pinned_config(info, num_workers=1)), 3)
    assert threads == {threading.get_ident()}
    threads.clear()
    take(build_dataloader(pinned_config(info, num_workers=1, pin_memory=True)), 3)
    assert threads and threading.get_ident() not in threads
    # Without workers the training thread makes the batches anyway: a side thread running
    # the pipeline would hold the GIL and make each hand-over wait for a switch interval.
    threads.clear()
    take(build_dataloader(pinned_config(info, num_workers=0, pin_memory=True)), 3)
    assert threads == {threading.get_ident()}


def test_skip_and_stopping_early_with_pinning(tmp_path):
    info = corpus(tmp_path)
    config = pinned_config(info, num_workers=2, pin_memory=True)
    reference = take(build_dataloader(pinned_config(info, num_workers=2)), 40)
    loader = build_dataloader(config)
    got = take(loader, 4) + take(loader, 1)  # the first iteration's thread is stopped
    for batch in loader:
        got.append(batch)
        if len(got) == 7:
            loader.skip(10)
        if len(got) == 20:
            break
    assert_same_batches(reference[:7] + reference[17:30], got)
    resumed = build_dataloader(config)
    resumed.load_state_dict(roundtrip(loader.snapshot()))
    assert_same_batches(reference[30:40], take(resumed, 10))
    assert not [t for t in threading.enumerate() if t.name == "fmsdata-pin"]


def test_an_error_while_assembling_reaches_the_training_thread(tmp_path):
    info = corpus(tmp_path)
    config = pinned_config(info, pin_memory=True)
    with pytest.raises(ConfigError, match="preprocess must return a mapping"):
        take(build_dataloader(config, preprocess=lambda line, n: line), 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_batches_come_pinned(tmp_path):
    info = corpus(tmp_path)
    for workers in (0, 2):
        config = pinned_config(info, num_workers=workers, pin_memory=True)
        for batch in take(build_dataloader(config), 3):
            assert all(value.is_pinned() for value in batch.values())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pinned_batches_are_the_ring_slot_copied_whole(tmp_path, monkeypatch, num_workers):
    """The pinned path without CUDA: pinned memory stood in by plain memory. A batch in
    its ring slot comes copied out of it (``BatchRing.hand_out_pinned``), each field in a
    pinned block of its own; the same batches as unpinned, kept ones unchanged while the
    ring turns, and it resumes exactly."""
    info = corpus(tmp_path)
    reference = take(build_dataloader(pinned_config(info, num_workers=num_workers)), 60)
    pinned_blocks = []

    class PinlessTorch:
        """``torch`` for fmsdata.transport.batchring, recording the pinned blocks asked for."""

        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*args, pin_memory=False, **kwargs):
            block = torch.empty(*args, **kwargs)
            if pin_memory:
                pinned_blocks.append(block)
            return block

    # Items of a batch or two: the ring holds a handful, so 60 batches turn it many times.
    small_items(monkeypatch, kept=1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self.clone())
    monkeypatch.setattr(fmsdata.transport.batchring, "torch", PinlessTorch())
    config = pinned_config(info, num_workers=num_workers, pin_memory=True)
    loader = build_dataloader(config)
    got = []
    for batch in loader:
        got.append(batch)  # every batch kept: the copies are the caller's own
        if len(got) == 60:
            break
    assert_same_batches(reference, got)
    fields = 3  # input_ids, labels, position_ids
    assert len(pinned_blocks) >= 50 * fields  # the others (if any) found their slot held
    for name, block in zip(["input_ids", "labels", "position_ids"], pinned_blocks):
        # Its own block: keeping or saving one field holds nothing of the others.
        assert got[0][name].data_ptr() == block.data_ptr()
        assert got[0][name].untyped_storage().nbytes() == got[0][name].nbytes
    if num_workers:  # how a batch leaves the ring is the same with or without workers
        check_resume(lambda: build_dataloader(config), total=40, points=[9, 31])
