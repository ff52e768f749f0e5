"""``Tracer.document`` finds every step, rank, row and token range at which a document was
delivered: checked against where its tokens are found in the batches two ranks got, from
the run's start, around a checkpoint, on a resumed world size and for a small dataset
that rotates over the logical shards."""

import numpy as np
import pytest
from support import base_config, corpus, roundtrip, take
from tracecheck import corpus_with_tiny, deliveries, rank_batches

from fmsdata import ConfigError, build_dataloader
from fmsdata.trace import Tracer

STEPS = 12


def merged(seen):
    """Pieces of one row that follow each other in the row and in the document, as one
    (how they look in the tokens)."""
    out = []
    for entry in sorted(seen, key=lambda e: (e["step"], e["rank"], e["row"], e["at"])):
        last = out[-1] if out else None
        if (
            last is not None
            and (last["step"], last["rank"], last["row"])
            == (entry["step"], entry["rank"], entry["row"])
            and last["at"] + last["length"] == entry["at"]
            and last["start"] + last["length"] == entry["start"]
        ):
            last["length"] += entry["length"]
        else:
            out.append({k: entry[k] for k in ("step", "rank", "row", "start", "length", "at")})
    return out


def sample_documents(info, n, seed=0):
    rng = np.random.default_rng(seed)
    paths = sorted(info.files)
    picks = set()
    while len(picks) < n:
        path = paths[int(rng.integers(len(paths)))]
        picks.add((path, int(rng.integers(len(info.files[path][0])))))
    return sorted(picks)


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"packing": "pad", "pad_token": 5},
        {"packing": "best_fit", "pad_token": 5, "pack_window": 6},
        {"skip_steps": [[3, 2]]},
    ],
)
def test_every_delivery_of_a_document_is_found(info, extra):
    config = base_config(info, **extra)
    delivered = rank_batches(config, 2, STEPS)
    skipped = sum(n for _, n in config.get("skip_steps", []))
    steps = {}
    told = [s for s in range(1, STEPS + skipped + 1) if not (4 <= s < 4 + skipped)]
    for k, step in enumerate(told):
        steps[step] = delivered[k]
    tracer = Tracer(config, world_size=2)
    found_any = 0
    for path, doc in sample_documents(info, 16):
        expected = []
        for step, batches in steps.items():
            expected += deliveries([batches], info, path, doc, first=step)
        dataset = path.split("/")[0]
        result = tracer.document(dataset, path, doc, until=STEPS + skipped).to_plain()
        assert merged(result["seen"]) == merged(expected), (path, doc)
        assert len(result["shards"]) == 1, "a document lives in one logical shard"
        found_any += bool(expected)
        if skipped:
            for entry in result["passed_over"]:
                assert 4 <= entry["step"] < 4 + skipped
    assert found_any >= 4, "the sample holds documents that were delivered"


def test_documents_are_found_around_a_checkpoint_and_on_a_new_world_size(info):
    config = base_config(info)
    loaders = [build_dataloader(config, rank=r, world_size=2) for r in range(2)]
    before = [take(loader, 5) for loader in loaders]
    states = [roundtrip(loader.snapshot()) for loader in loaders]
    after = []
    for rank in range(4):
        loader = build_dataloader(config, rank=rank, world_size=4)
        loader.load_state_dict(states)
        after.append(take(loader, 6))
    steps = [[before[r][s] for r in range(2)] for s in range(5)]
    steps += [[after[r][s] for r in range(4)] for s in range(6)]
    tracer = Tracer(config, checkpoint=states, world_size=4)
    for path, doc in sample_documents(info, 12, seed=1):
        expected = deliveries(steps, info, path, doc)
        result = tracer.document(path.split("/")[0], path, doc, until=11).to_plain()
        assert merged(result["seen"]) == merged(expected), (path, doc)
        if any(e["step"] <= 5 for e in expected):
            assert "reaches the checkpoint's state" in result["checked"]


def test_a_rotating_dataset_is_followed_over_every_shard(tmp_path):
    info = corpus_with_tiny(tmp_path)
    config = base_config(info, datasets=["a", "b", "tiny"], weights=[1.0, 1.0, 0.5])
    delivered = rank_batches(config, 2, 8)
    tracer = Tracer(config, world_size=2)
    for doc in range(3):
        path = "tiny/shard_00000.arrow"
        expected = deliveries(delivered, info, path, doc)
        result = tracer.document("tiny", "shard_00000.arrow", doc, until=8).to_plain()
        assert merged(result["seen"]) == merged(expected)
        assert result["shards"] == [0, 1, 2, 3]
        assert expected, "a small dataset's documents come back every few lines"


def test_documents_are_named_by_path_index_or_refused(info):
    tracer = Tracer(base_config(info), world_size=2)
    by_path = tracer.document("a", "a/shard_00001.arrow", 3, until=4).to_plain()
    assert tracer.document("a", "shard_00001.arrow", 3, until=4).to_plain() == by_path
    assert tracer.document("a", 1, 3, until=4).to_plain() == by_path
    assert by_path["document"] == {"dataset": "a", "file": "a/shard_00001.arrow", "doc": 3}
    for bad, match in [
        (("c", 0, 0), "no dataset 'c'"),
        (("a", "nope.arrow", 0), "no file"),
        (("a", 0, 999), "holds 24 documents"),
    ]:
        with pytest.raises(ConfigError, match=match):
            tracer.document(*bad, until=2)
    with pytest.raises(ConfigError, match="--until"):
        tracer.document("a", 0, 0)


def test_a_dataset_added_on_resume_is_sought_after_the_checkpoint_only(tmp_path):
    info = corpus_with_tiny(tmp_path)
    config = base_config(info, datasets=["a", "b"], weights=[2.0, 1.0])
    loaders = [build_dataloader(config, rank=r, world_size=2) for r in range(2)]
    before = [take(loader, 3) for loader in loaders]
    states = [roundtrip(loader.snapshot()) for loader in loaders]
    changed = {**config, "datasets": ["a", "b", "tiny"], "weights": [1.0, 1.0, 1.0]}
    changed["allow_mix_change"] = True
    after = []
    for rank in range(2):
        loader = build_dataloader(changed, rank=rank, world_size=2)
        loader.load_state_dict(states)
        after.append(take(loader, 5))
    steps = [[before[r][s] for r in range(2)] for s in range(3)]
    steps += [[after[r][s] for r in range(2)] for s in range(5)]
    tracer = Tracer(changed, checkpoint=states)
    for doc in range(3):
        expected = deliveries(steps, info, "tiny/shard_00000.arrow", doc)
        found = tracer.document("tiny", 0, doc, until=8).to_plain()
        assert merged(found["seen"]) == merged(expected) and expected
        assert "checked" not in found  # nothing before the checkpoint to tell
