"""``document_ids``: every token names the document it was written in, on every world
size, worker count and resume point."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from support import (
    BOL,
    BOS,
    EOL,
    EOS,
    FIRST_TOKEN,
    PAD,
    Ledger,
    assert_same_batches,
    base_config,
    corpus,
    roundtrip,
    scratch_dir,
    take,
)

from fmsdata import build_dataloader
from fmsdata.stages.outputs import split_document_id


def check_ids_against_the_documents(info, config, batches):
    paths = Ledger(info, config).paths
    for batch in batches:
        for row, ids, labels in zip(
            batch["input_ids"].numpy(), batch["document_ids"].numpy(), batch["labels"].numpy()
        ):
            padding = ids == -1
            # -1 exactly on padding (whose labels are ignored).
            assert (row[padding] == PAD).all()
            assert (labels[padding] == -100).all()
            ds, f, d = split_document_id(ids[~padding])
            for token, a, b, c in zip(row[~padding].tolist(), *(x.tolist() for x in (ds, f, d))):
                firsts, lengths = info.files[paths[a][b]]
                if token >= FIRST_TOKEN:
                    assert firsts[c] <= token < firsts[c] + lengths[c]
                else:
                    assert token in (BOS, EOS, BOL, EOL)
            # A BOS starts its document: the next token is the document's first one.
            for k in np.flatnonzero(row[:-1] == BOS).tolist():
                if row[k + 1] >= FIRST_TOKEN:
                    a, b, c = (int(x) for x in split_document_id(ids[k]))
                    assert row[k + 1] == info.files[paths[a][b]][0][c]
                    assert ids[k + 1] == ids[k]


@settings(max_examples=6, deadline=None)
@given(
    world=st.sampled_from([1, 2]),
    workers=st.sampled_from([0, 1, 2]),
    packing=st.sampled_from(["hard", "pad", "best_fit"]),
    save_at=st.integers(0, 6),
)
def test_document_ids_agree_with_the_documents_as_written(world, workers, packing, save_at):
    info = corpus(scratch_dir(), {"a": 2, "b": 2}, docs_per_file=10, mean_length=30)
    extra = {"packing": packing, "pad_token": PAD, "pack_window": 5} if packing != "hard" else {}
    config = base_config(
        info,
        return_document_ids=True,
        return_position_ids=True,
        bol_token=BOL,
        eol_token=EOL,
        num_workers=workers,
        batch_size=4 // world,
        **extra,
    )
    loaders = [build_dataloader(config, rank=r, world_size=world) for r in range(world)]
    reference = [take(loader, 8) for loader in loaders]
    for batches in reference:
        check_ids_against_the_documents(info, config, batches)
        for batch in batches:
            # A document's id changes only where its position restarts.
            ids, positions = batch["document_ids"], batch["position_ids"]
            assert (positions[:, 1:][ids[:, 1:] != ids[:, :-1]] == 0).all()
    first = [build_dataloader(config, rank=r, world_size=world) for r in range(world)]
    for loader in first:
        take(loader, save_at)
    states = [roundtrip(loader.snapshot()) for loader in first]
    for r, batches in enumerate(reference):
        resumed = build_dataloader(config, rank=r, world_size=world)
        resumed.load_state_dict(states)
        assert_same_batches(batches[save_at:], take(resumed, 8 - save_at))
