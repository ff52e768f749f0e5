"""The line-number replica of the journaled buffers against ``apply_journal`` on lists."""

import pickle

import numpy as np
import pytest
from support import apply_journal

from fmsdata.bufferreplica import BufferReplica
from fmsdata.narrowrows import NarrowRows
from fmsdata.stages.shuffle import PUSH


def _journal(rng, sizes, sids, window, steps, chunk):
    """One item's ops (each shard's together, as a worker sends them) and pushed lines
    (spans whose values say which item and push made them)."""
    ops, pushed = [], []
    for sid in sids:
        for _ in range(rng.integers(0, steps + 1)):
            while sizes[sid] < window and rng.random() < 0.8:
                ops.append((sid, PUSH))
                width = int(rng.integers(1, 4))
                pushed.append(np.full((width, 5), chunk * 1000 + len(pushed), dtype=np.int32))
                sizes[sid] += 1
            if sizes[sid]:
                ops.append((sid, int(rng.integers(0, sizes[sid]))))
                sizes[sid] -= 1
    offsets = np.zeros(len(pushed) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pushed], out=offsets[1:])
    spans = np.concatenate(pushed) if pushed else np.zeros((0, 5), dtype=np.int32)
    return np.asarray(ops, dtype=np.int64).reshape(-1, 2), spans, offsets


@pytest.mark.parametrize("seed", range(4))
def test_replica_follows_apply_journal(seed):
    rng = np.random.default_rng(seed)
    shard_ids = [3, 7, 8, 20]
    restored = {7: 5, 20: 2}  # lines of the buffers the shards resumed with
    window = 4 if seed < 2 else 9  # below a restored buffer's size: the replica widens
    replica = BufferReplica(shard_ids, restored)
    lists = {sid: list(range(restored.get(sid, 0))) for sid in shard_ids}
    sizes = {sid: len(lines) for sid, lines in lists.items()}
    for chunk in range(60):
        sids = [sid for sid in shard_ids if rng.random() < 0.7]
        ops, spans, offsets = _journal(rng, sizes, sids, window + chunk // 20, 6, chunk)
        # As the main process gets them: packed by a worker, unpacked here.
        replica.apply(ops, pickle.loads(pickle.dumps(NarrowRows(spans))), offsets)
        lines = iter([spans[a:b] for a, b in zip(offsets[:-1], offsets[1:])])
        for sid in sids:
            apply_journal(lists[sid], ops[ops[:, 0] == sid, 1].tolist(), lines)
        for sid in shard_ids:
            got = replica.lines(sid)
            assert len(got) == len(lists[sid])
            for mine, theirs in zip(got, lists[sid]):
                if isinstance(theirs, int):
                    assert mine == theirs
                else:
                    assert np.array_equal(mine, theirs) and mine.dtype == theirs.dtype
    # Chunks none of whose lines is held are forgotten.
    held = {int(line[0, 0]) // 1000 for sid in shard_ids for line in lists[sid]
            if not isinstance(line, int)}  # fmt: skip
    kept = {int(chunk[0].array[0, 0]) // 1000 for chunk in replica._chunks if chunk is not None}
    assert kept == held
