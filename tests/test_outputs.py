"""What a batch holds: shapes, the causal shift, -100 on padding, document structure."""

import numpy as np
import pytest
import torch
from support import BOL, EOL, EOS, FIRST_TOKEN, PAD, assert_same_batches, base_config, corpus, take
from torch.utils.data import get_worker_info

import fmsdata.transport.batchring
from fmsdata import build_dataloader
from fmsdata.errors import ConfigError


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shapes_and_the_causal_shift(tmp_path, num_workers):
    info = corpus(tmp_path)
    config = base_config(info, num_workers=num_workers)
    for batch in take(build_dataloader(config), 5):
        assert batch["input_ids"].shape == (4, 32) and batch["labels"].shape == (4, 32)
        assert batch["input_ids"].dtype == torch.int64 and batch["labels"].dtype == torch.int64
        assert batch["input_ids"].is_contiguous() and batch["labels"].is_contiguous()
        assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])


@pytest.mark.parametrize("packing", ["pad", "best_fit"])
def test_padding_is_ignored_by_the_loss(tmp_path, packing):
    info = corpus(tmp_path, mean_length=10)
    config = base_config(info, packing=packing, pad_token=PAD, pack_window=3)
    batches = take(build_dataloader(config), 10)
    saw_pad = False
    for batch in batches:
        inputs, labels = batch["input_ids"], batch["labels"]
        # The target of position t is input t + 1 (the last target has no input to show it).
        padded_target = inputs[:, 1:] == PAD
        assert (labels[:, :-1][padded_target] == -100).all()
        assert (labels[:, :-1][~padded_target] != -100).all()
        assert (labels[inputs[:, -1] == PAD, -1] == -100).all()
        saw_pad |= bool(padded_target.any())
    assert saw_pad


def document_of(info):
    """Token value -> id of the written document holding it (the corpus's own record)."""
    end = max(stop for _, stop in info.ranges.values())
    owner = np.full(end, -1, dtype=np.int64)
    doc = 0
    for firsts, lengths in info.files.values():
        for first, length in zip(firsts.tolist(), lengths.tolist()):
            owner[first : first + length] = doc
            doc += 1
    return owner


def reference_segments(row, owner):
    """Lengths of the document pieces of one input row, from the documents as written:
    BOS and BOL belong to the document after them, EOS and EOL to the one before."""
    before = -2  # the document a line starts inside of, begun in an earlier line
    ids = np.full(len(row), -1, dtype=np.int64)
    content = row >= FIRST_TOKEN
    ids[content] = owner[row[content]]
    for i in range(len(row)):  # EOS/EOL: the document before
        if ids[i] == -1 and row[i] in (EOS, EOL):
            ids[i] = ids[i - 1] if i > 0 and ids[i - 1] != -1 else before
            if i == 1 and ids[0] == -1:  # BOL, then the end of an earlier document
                ids[0] = before
    for i in reversed(range(len(row) - 1)):  # BOS/BOL: the document after
        if ids[i] == -1:
            ids[i] = ids[i + 1]
    assert (ids != -1).all()
    cuts = np.flatnonzero(np.diff(ids)) + 1
    return np.diff(np.concatenate([[0], cuts, [len(row)]]))


def test_document_structure_matches_the_documents_as_written(tmp_path):
    info = corpus(tmp_path)
    owner = document_of(info)
    config = base_config(
        info, bol_token=BOL, eol_token=EOL, return_position_ids=True, return_cu_seqlens=True
    )
    for batch in take(build_dataloader(config), 6):
        inputs, pos = batch["input_ids"].numpy(), batch["position_ids"].numpy()
        expected = [reference_segments(row, owner) for row in inputs]
        for p, lengths in zip(pos, expected):
            assert np.array_equal(p, np.concatenate([np.arange(n) for n in lengths]))
        lengths = np.concatenate(expected)
        assert np.array_equal(
            batch["cu_seqlens"].numpy(), np.concatenate([[0], np.cumsum(lengths)])
        )
        assert int(batch["max_seqlen"]) == int(lengths.max())


def test_document_structure_is_the_same_with_workers(tmp_path):
    info = corpus(tmp_path)
    config = base_config(info, return_position_ids=True, return_cu_seqlens=True, batch_size=5)
    one = take(build_dataloader(config), 8)
    three = take(build_dataloader({**config, "num_workers": 3}), 8)
    for a, b in zip(one, three):
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_custom_preprocess_runs_in_workers(tmp_path):
    info = corpus(tmp_path)

    def masked_lm(line, n_tokens):
        worker = get_worker_info()  # None in the main process
        return {
            "tokens": line[:-1],
            "mask": (line[:-1] % 2 == 0).astype(np.int64),
            "worker": np.array([-1 if worker is None else worker.id]),
        }

    config = base_config(info, num_workers=2)
    batches = take(build_dataloader(config, preprocess=masked_lm), 4)
    reference = take(build_dataloader(base_config(info)), 4)
    for got, ref in zip(batches, reference):
        assert set(got) == {"tokens", "mask", "worker"}
        assert torch.equal(got["tokens"], ref["input_ids"])
        assert torch.equal(got["mask"], (ref["input_ids"] % 2 == 0).long())
    assert {int(w) for got in batches for w in got["worker"].ravel()} == {0, 1}


def test_line_delimiters(tmp_path):
    info = corpus(tmp_path)
    config = base_config(info, bol_token=BOL, eol_token=EOL)
    for batch in take(build_dataloader(config), 4):
        assert (batch["input_ids"][:, 0] == BOL).all()
        assert (batch["labels"][:, -1] == EOL).all()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_tuple_batches_hold_the_dict_batches_tensors_in_key_order(tmp_path, num_workers):
    info = corpus(tmp_path)
    config = base_config(info, num_workers=num_workers, return_position_ids=True)
    named = take(build_dataloader(config), 4)
    loader = build_dataloader({**config, "batch_format": "tuple"})
    for batch, (input_ids, labels, position_ids) in zip(named, loader):
        assert torch.equal(input_ids, batch["input_ids"]) and torch.equal(labels, batch["labels"])
        assert torch.equal(position_ids, batch["position_ids"])
    assert loader.steps == 4


def test_a_tuple_batch_of_one_tensor_is_that_tensor(tmp_path):
    info = corpus(tmp_path)
    config = base_config(info, batch_format="tuple")
    batch = next(iter(build_dataloader(config, preprocess=lambda line, n: {"line": line})))
    assert isinstance(batch, torch.Tensor) and batch.shape == (4, 33)


def _as_int32_with_first_labels_ignored(batch, ignored):
    out = {}
    for key, value in batch.items():
        if key in ("input_ids", "labels", "position_ids"):
            value = value.to(torch.int32)
        out[key] = value
    labels = out["labels"].clone()
    labels[:, :ignored] = -100
    out["labels"] = labels
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("in_slot", [True, False])
def test_int32_outputs_are_the_int64_ones_cast(tmp_path, monkeypatch, num_workers, in_slot):
    """``output_dtype="int32"`` and ``ignore_first_labels``: the workers write the int64
    batches' values as int32, each line's first labels ignored, in the ring or (slots held)
    in fresh memory, several workers' rows copied together."""
    info = corpus(tmp_path)
    structure = dict(return_position_ids=True, return_cu_seqlens=True)
    reference = take(build_dataloader(base_config(info, **structure)), 30)
    if not in_slot:
        monkeypatch.setattr(
            fmsdata.transport.batchring.BatchRing,
            "claim_all",
            lambda self, first, n: (np.full(n, -1), self._data),
        )
    config = base_config(
        info, num_workers=num_workers, output_dtype="int32", ignore_first_labels=2, **structure
    )
    got = take(build_dataloader(config), 30)
    expected = [_as_int32_with_first_labels_ignored(b, 2) for b in reference]
    for batch in got:
        assert batch["input_ids"].dtype == batch["labels"].dtype == torch.int32
    assert_same_batches(expected, got)


def test_output_settings_with_a_preprocess_are_refused(tmp_path):
    """A preprocess replaces the built-in outputs: output_dtype and ignore_first_labels
    would be silently ignored."""
    info = corpus(tmp_path)
    for changes in ({"output_dtype": "int32"}, {"ignore_first_labels": 1}):
        with pytest.raises(ConfigError, match="which a preprocess replaces"):
            build_dataloader(base_config(info, **changes), preprocess=lambda line, n: {})
