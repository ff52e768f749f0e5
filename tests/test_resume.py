"""G1: exact resume, for every worker count and with every stage on."""

import numpy as np
import pytest
from support import (
    BOL,
    EOL,
    EOS,
    assert_same_batches,
    base_config,
    check_resume,
    corpus,
    roundtrip,
    run_in_fresh_process,
    take,
)

from fmsdata import build_dataloader
from fmsdata.stages.savedchain import stage_state
from fmsdata.state.file import save_state


def every_stage(info, **overrides):
    """Two weighted datasets, BOS/EOS, stripping, line delimiters, shuffle, doc structure."""
    return base_config(
        info,
        bol_token=BOL,
        eol_token=EOL,
        strip_tokens=[EOS],
        min_length=3,
        return_position_ids=True,
        return_cu_seqlens=True,
        **overrides,
    )


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_resume_is_exact_for_every_worker_count(tmp_path, num_workers):
    info = corpus(tmp_path)
    config = every_stage(info, num_workers=num_workers)
    # By batch 80 every logical shard has finished an epoch of at least one dataset, so
    # the last resume point lies across an epoch boundary.
    probe = build_dataloader(config)
    take(probe, 80)
    snapshot = probe.snapshot()
    for entry in snapshot["shards"]:
        mixer = stage_state(entry["state"], snapshot["fingerprint"], "mixer")
        streams = mixer["sources"].values()
        assert max(s["epoch"] for s in streams) >= 1
    check_resume(lambda: build_dataloader(config), total=100, points=[0, 37, 80])


@pytest.mark.parametrize("packing", ["hard", "pad", "best_fit"])
def test_resume_in_every_packing_mode(tmp_path, packing):
    info = corpus(tmp_path, mean_length=20)
    config = every_stage(info, packing=packing, pad_token=5, shuffle_window=3, pack_window=6)
    check_resume(lambda: build_dataloader(config), total=30, points=[1, 11, 29])


def test_worker_count_does_not_change_the_batches(tmp_path):
    info = corpus(tmp_path)
    reference = take(build_dataloader(every_stage(info, num_workers=0)), 40)
    for workers in (1, 2, 3):
        assert_same_batches(
            reference, take(build_dataloader(every_stage(info, num_workers=workers)), 40)
        )


def test_resume_with_a_different_worker_count(tmp_path):
    info = corpus(tmp_path)
    reference = take(build_dataloader(every_stage(info, num_workers=0)), 40)
    head = build_dataloader(every_stage(info, num_workers=2))
    take(head, 13)
    resumed = build_dataloader(every_stage(info, num_workers=3))
    resumed.load_state_dict(roundtrip(head.snapshot()))
    assert_same_batches(reference[13:], take(resumed, 27))


def test_iterating_again_continues_where_the_caller_stopped(tmp_path):
    info = corpus(tmp_path)
    reference = take(build_dataloader(every_stage(info, num_workers=2)), 30)
    loader = build_dataloader(every_stage(info, num_workers=2))
    got = take(loader, 7) + take(loader, 1) + take(loader, 22)
    assert_same_batches(reference, got)


@pytest.mark.slow
def test_resume_in_a_fresh_process(tmp_path):
    info = corpus(tmp_path / "data")
    config = every_stage(info, num_workers=2)
    reference = take(build_dataloader(config), 25)
    head = build_dataloader(config)
    take(head, 9)
    save_state(str(tmp_path / "state.fms"), head.snapshot())
    resumed = run_in_fresh_process(
        config, str(tmp_path / "state.fms"), 16, str(tmp_path / "out.pt")
    )
    assert_same_batches(reference[9:], resumed)


@pytest.mark.parametrize("workers", [2, 4])
def test_batches_made_whole_by_one_worker_are_the_same_batches(tmp_path, workers):
    """8 shards in runs of batch_size 2: each worker makes whole batches (the main process
    copies them in one piece); the batches and a resume into a mixed split are unchanged."""
    info = corpus(tmp_path)
    config = every_stage(info, logical_shards=8, batch_size=2)
    reference = take(build_dataloader({**config, "num_workers": 0}), 40)
    assert_same_batches(reference, take(build_dataloader({**config, "num_workers": workers}), 40))
    head = build_dataloader({**config, "num_workers": workers})
    take(head, 13)
    resumed = build_dataloader({**config, "num_workers": 3})  # 4 runs over 3: round-robin
    resumed.load_state_dict(roundtrip(head.snapshot()))
    assert_same_batches(reference[13:], take(resumed, 27))


@pytest.mark.parametrize("workers", [0, 1])
def test_the_main_process_saves_document_ends_as_a_shard_would(tmp_path, workers):
    """The saved buffers equal each shard's own, rebuilt from them and saved where it
    stands: spans that run to their document's end are saved without their length."""

    info = corpus(tmp_path)
    config = every_stage(info, logical_shards=4, batch_size=4, num_workers=workers)
    loader = build_dataloader(config)
    take(loader, 17)
    snapshot = loader.snapshot()
    fingerprint = snapshot["fingerprint"]
    reference = build_dataloader({**config, "num_workers": 0})
    dataset = reference.dataset
    context = dataset.shard_context(4)
    ends = 0
    for entry in snapshot["shards"]:
        sid, state = entry["id"], entry["state"]
        mine = stage_state(state, fingerprint, "shuffle")["buffer"]
        shard = context.open(sid, dataset.stages, state=state, advance=0)
        again = stage_state(shard.state_dict(), fingerprint, "shuffle")["buffer"]
        for key in again:
            assert np.array_equal(np.asarray(mine[key]), np.asarray(again[key])), key
        ends += int((np.asarray(mine["length"]) == 0).sum())
    assert ends > 0  # spans to a document's end were saved without their length


@pytest.mark.parametrize("workers", [0, 1])
def test_iterating_the_dataset_directly_leaves_the_loaders_batches_alone(tmp_path, workers):
    """The final-batch ring belongs to the loader's own iteration: items read from
    ``loader.dataset`` directly carry their batches themselves."""
    info = corpus(tmp_path)
    config = every_stage(info, num_workers=workers)
    reference = take(build_dataloader(config), 12)
    loader = build_dataloader(config)
    batches = iter(loader)
    got = [next(batches) for _ in range(4)]  # mid-item: items grow 1, 2, 4, ... batches
    direct = iter(loader.dataset)
    for _ in range(7):
        item = next(direct)
        assert item.overflow is not None and not item.placed.any()
    got += [next(batches) for _ in range(8)]
    assert_same_batches(reference, got)
