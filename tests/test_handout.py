"""Workers write the final batches into a ring the main process hands out without copying
(``fmsdata.transport.batchring``): the batches are the packed lines shifted, and a batch the caller
keeps is never written again."""

import numpy as np
import pytest
import torch
from support import EOL, PAD, assert_same_batches, base_config, corpus, small_items, take

import fmsdata.transport.batchring
from fmsdata import build_dataloader
from fmsdata.errors import ConfigError
from fmsdata.stages.outputs import IGNORE_INDEX

STRUCTURE = dict(return_position_ids=True, return_cu_seqlens=True, return_document_ids=True)


def padded_config(info, **overrides):
    return base_config(info, packing="pad", pad_token=PAD, eol_token=EOL, **overrides)


def raw_lines(line, n):
    return {"line": line, "n": np.array(n)}


def shifted(lines: torch.Tensor, content: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal-LM step as the main process made it before the workers did: inputs and
    labels widened to int64, no loss from a padded line's last content token on."""
    seq = lines.shape[1] - 1
    inputs, labels = lines[:, :-1].long(), lines[:, 1:].long().clone()
    keep = (content - 1).clamp(min=0)[:, None]
    labels[torch.arange(seq)[None, :] >= keep] = IGNORE_INDEX
    return inputs, labels


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_batches_are_the_packed_lines_shifted(tmp_path, num_workers):
    info = corpus(tmp_path)
    lines = take(build_dataloader(padded_config(info), preprocess=raw_lines), 30)
    config = padded_config(info, num_workers=num_workers, **STRUCTURE)
    batches = take(build_dataloader(config), 30)
    padded = 0
    for raw, batch in zip(lines, batches):
        inputs, labels = shifted(raw["line"], raw["n"])
        assert torch.equal(batch["input_ids"], inputs)
        assert torch.equal(batch["labels"], labels)
        padded += int((raw["n"] <= config["seq_length"]).sum())
        # Positions restart, and document ids change only, at the cu_seqlens boundaries.
        cu = batch["cu_seqlens"].long()
        lengths = cu[1:] - cu[:-1]
        starts = torch.repeat_interleave(cu[:-1], lengths)
        flat = torch.arange(int(cu[-1])) - starts
        assert torch.equal(batch["position_ids"].flatten(), flat)
        ids = batch["document_ids"].flatten()
        assert torch.equal(ids, torch.repeat_interleave(ids[cu[:-1]], lengths))
        assert all(v.dtype == torch.int64 for k, v in batch.items() if k != "cu_seqlens")
    assert padded, "the config pads lines"
    if num_workers:
        reference = take(build_dataloader(padded_config(info, **STRUCTURE)), 30)
        assert_same_batches(reference, batches)


def keep_and_check(loader, kept: int, later: int) -> list[dict[str, torch.Tensor]]:
    """Keep the first ``kept`` batches (with a view and a numpy array of one), take
    ``later`` more, and return the kept batches if none of them changed meanwhile."""
    iterator = iter(loader)
    held = [next(iterator) for _ in range(kept)]
    copies = [{k: v.clone() for k, v in batch.items()} for batch in held]
    view = held[-1]["input_ids"][1:]
    array = held[-2]["labels"].numpy()
    view_copy, array_copy = view.clone(), array.copy()
    del held[-1]["input_ids"], held[-2]["labels"]  # only the view and the array keep them
    for _ in range(later):
        next(iterator)
    assert torch.equal(view, view_copy)
    assert np.array_equal(array, array_copy)
    for i, (batch, copy) in enumerate(zip(held, copies)):
        for key, value in batch.items():
            assert torch.equal(value, copy[key]), f"kept batch {i} changed in {key!r}"
    return copies


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_a_kept_batch_is_never_written_again(tmp_path, monkeypatch, num_workers):
    info = corpus(tmp_path)
    reference = take(build_dataloader(padded_config(info, **STRUCTURE)), 220)
    small_items(monkeypatch, kept=1)
    config = padded_config(info, num_workers=num_workers, **STRUCTURE)
    kept = keep_and_check(build_dataloader(config), 20, 200)
    assert_same_batches(reference[:20], kept)
    # Without keeping anything, the ring is reused, and the batches are the same.
    assert_same_batches(reference, take(build_dataloader(config), 220))


def test_the_check_catches_a_ring_that_reuses_kept_slots(tmp_path, monkeypatch):
    """The test above fails on a ring that writes a slot again without asking whether its
    batch is still kept."""
    info = corpus(tmp_path)
    small_items(monkeypatch, kept=1)
    ring = fmsdata.transport.batchring.BatchRing
    monkeypatch.setattr(ring, "claim_all", naive_claim_all)
    monkeypatch.setattr(ring, "hand_out", naive_hand_out)
    config = padded_config(info, num_workers=1)
    with pytest.raises(AssertionError, match="changed|assert"):
        keep_and_check(build_dataloader(config), 20, 200)


def naive_claim_all(self, first, n):
    return np.arange(first, first + n) % self.slots, self._data


def naive_hand_out(self, batch):
    self.position = batch + 1
    return [torch.from_numpy(view) for view in self._data[batch % self.slots]]


def test_kept_batches_survive_a_skip_that_restarts_the_workers(tmp_path, monkeypatch):
    info = corpus(tmp_path)
    reference = take(build_dataloader(padded_config(info)), 80)
    small_items(monkeypatch, kept=1)
    loader = build_dataloader(padded_config(info, num_workers=2))
    held, got = [], []
    for batch in loader:
        got.append(batch)
        if len(got) <= 10:
            held.append({k: v.clone() for k, v in batch.items()})
        if len(got) == 10:
            loader.skip(30)  # past the items in hand: the workers restart
        if len(got) == 50:
            break
    assert_same_batches(reference[:10] + reference[40:80], got)
    assert_same_batches(held, got[:10])


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_batches_that_find_their_slot_held_come_in_fresh_memory(tmp_path, monkeypatch, num_workers):
    """Every slot found held: each worker writes its rows into fresh memory of its item;
    one worker's are handed out as they are, several workers' are copied together."""
    info = corpus(tmp_path)
    config = padded_config(info, num_workers=num_workers, **STRUCTURE)
    reference = take(build_dataloader(padded_config(info, **STRUCTURE)), 40)
    monkeypatch.setattr(
        fmsdata.transport.batchring.BatchRing,
        "claim_all",
        lambda self, first, n: (np.full(n, -1), self._data),
    )
    assert_same_batches(reference, take(build_dataloader(config), 40))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_two_live_iterations_have_a_ring_each(tmp_path, monkeypatch, num_workers):
    info = corpus(tmp_path)
    reference = take(build_dataloader(padded_config(info)), 60)
    small_items(monkeypatch, kept=1)
    loader = build_dataloader(padded_config(info, num_workers=num_workers))
    first = iter(loader)
    held = [next(first) for _ in range(5)]
    second = iter(loader)  # continues from the 5 batches consumed
    assert_same_batches(reference[5:55], [next(second) for _ in range(50)])
    assert_same_batches(reference[:5], held)
    next(first)  # the first iteration still runs on its own ring


def test_too_little_shared_memory_for_the_ring_is_a_config_error(tmp_path, monkeypatch):
    """A container's /dev/shm (64 MiB by default in docker) too small for the workers'
    ring: a ConfigError at the start of iteration saying how much it needs and what to
    change, not torch's "unable to allocate shared memory" from deep inside."""
    info = corpus(tmp_path)
    loader = build_dataloader(padded_config(info, num_workers=2))
    monkeypatch.setattr(fmsdata.transport.batchring, "shared_memory_free", lambda: 1000)
    with pytest.raises(ConfigError, match=r"needs \d+ MiB of shared memory .* has 0 MiB free"):
        take(loader, 1)
    # Where the free space cannot be asked, torch's own refusal gets the same advice.
    monkeypatch.setattr(fmsdata.transport.batchring, "shared_memory_free", lambda: None)

    def refuse(self):
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1>")

    monkeypatch.setattr(torch.Tensor, "share_memory_", refuse)
    with pytest.raises(ConfigError, match="unable to allocate shared memory.*--shm-size"):
        take(build_dataloader(padded_config(info, num_workers=2)), 1)


def test_without_workers_the_ring_needs_no_shared_memory(tmp_path, monkeypatch):
    info = corpus(tmp_path)
    monkeypatch.setattr(fmsdata.transport.batchring, "shared_memory_free", lambda: 0)
    assert len(take(build_dataloader(padded_config(info)), 3)) == 3
