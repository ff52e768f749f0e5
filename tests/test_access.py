"""The worker's reader cache (fmsdata/data/access.py): readers beyond its capacity close least
recently used first, and while the files behind them take more room than allowed (a
remote cache over remote_cache_gb, where an open reader pins its file) down to a floor."""

from fmsdata.data.access import ReaderCache


class Handler:
    def open(self, path):
        return path

    def close(self, reader):
        pass


def _open(cache, keys, closed):
    for key in keys:
        cache.get(key, Handler(), lambda key=key: key, lambda key=key: closed.append(key))


def test_readers_beyond_capacity_close_least_recently_used_first():
    closed = []
    cache = ReaderCache(3)
    _open(cache, "abcab", closed)
    _open(cache, "d", closed)
    assert closed == ["c"]


def test_over_the_limit_readers_close_down_to_the_floor():
    closed, full = [], [False]
    cache = ReaderCache(10, over_limit=lambda: full[0], floor=3)
    _open(cache, "abcdef", closed)
    assert closed == []  # within the limit: capacity rules
    full[0] = True
    _open(cache, "g", closed)
    assert closed == ["a", "b", "c", "d"]  # the three most recent stay open
    full[0] = False
    _open(cache, "hij", closed)
    assert len(closed) == 4
