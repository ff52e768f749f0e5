"""``Tracer.step`` tells every row of a global step as it was delivered: each piece
checked against the corpus's own record of its tokens and the batches two ranks got,
for every stage the default chain has and 0, 1 or 2 workers."""

import pytest
from support import BOL, EOL, PAD, base_config, corpus
from tracecheck import assert_step_delivered, corpus_with_tiny, rank_batches

from fmsdata.trace import Tracer

STEPS = 10

CONFIGS = {
    "default": {},
    "pad": {"packing": "pad", "pad_token": PAD},
    "best_fit": {"packing": "best_fit", "pad_token": PAD, "pack_window": 6},
    "sequential": {"document_order": "sequential"},
    "line delimiters": {"bol_token": BOL, "eol_token": EOL, "shuffle_window": 1},
    "min_length": {"min_length": 30},
    "schedule in steps": {
        "weights": None,
        "weight_schedule": [[0, [1.0, 0.0]], [3, [0.2, 0.8]], [6, [0.7, 0.3]]],
        "schedule_unit": "steps",
        "global_batch_size": 8,
    },
    "linear schedule in tokens": {
        "weights": None,
        "weight_schedule": [[0, [0.1, 0.9]], [1500, [0.9, 0.1]]],
        "schedule_interpolation": "linear",
        "schedule_resolution": 7,
    },
    "skips": {"skip_steps": [[2, 3], [7, 1]]},
    "uneven shards": {"logical_shards": 6, "batch_size": 3},
}


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_step_is_told_as_delivered(info, name):
    config = base_config(info, **CONFIGS[name])
    delivered = rank_batches(config, 2, STEPS)
    tracer = Tracer(config, world_size=2)
    skipped = {s for at, n in config.get("skip_steps", []) for s in range(at + 1, at + n + 1)}
    told_steps = [s for s in range(1, STEPS + len(skipped) + 1) if s not in skipped]
    traces = {t.step: t for t in tracer.steps(range(1, STEPS + len(skipped) + 1))}
    for step in skipped:
        assert traces[step].skipped is not None, step
    for k, step in enumerate(told_steps):
        assert_step_delivered(traces[step].to_plain(), delivered[k], info)


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_change_nothing_told(info, workers):
    config = base_config(info, num_workers=workers)
    delivered = rank_batches(config, 2, 6)
    tracer = Tracer(base_config(info), world_size=2)
    for step, trace in enumerate(tracer.steps(range(1, 7)), 1):
        assert_step_delivered(trace.to_plain(), delivered[step - 1], info)


def test_a_small_dataset_rotates_and_is_told(tmp_path):
    info = corpus_with_tiny(tmp_path)
    config = base_config(info, datasets=["a", "b", "tiny"], weights=[1.0, 1.0, 0.5])
    delivered = rank_batches(config, 2, 8)
    for step, trace in enumerate(Tracer(config, world_size=2).steps(range(1, 9)), 1):
        told = trace.to_plain()
        assert_step_delivered(told, delivered[step - 1], info)
    pieces = [p for s in delivered for b in s for p in b["input_ids"].flatten().tolist()]
    tiny = info.ranges["tiny"]
    assert any(tiny[0] <= t < tiny[1] for t in pieces), "the tiny dataset is read"


def test_the_world_size_comes_from_global_batch_size(info):
    config = base_config(info, global_batch_size=8)
    assert Tracer(config).step(1).world_size == 2
