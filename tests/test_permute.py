import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fmsdata.util.permute import derive_key, hash_index, permute


@given(n=st.integers(1, 5000), key=st.integers(0, 2**64 - 1))
def test_permute_is_a_bijection_of_range_n(n, key):
    values = permute(np.arange(n), n, key)
    assert np.array_equal(np.sort(values), np.arange(n))


@given(n=st.integers(2, 3000), key=st.integers(0, 2**64 - 1), start=st.integers(0, 2999))
def test_any_window_of_positions_matches_the_whole_order(n, key, start):
    start = start % n
    whole = permute(np.arange(n), n, key)
    assert np.array_equal(permute(np.arange(start, n), n, key), whole[start:])


def test_order_depends_on_the_key():
    n = 1000
    a = permute(np.arange(n), n, derive_key(1, "a", 0))
    b = permute(np.arange(n), n, derive_key(1, "a", 1))
    assert not np.array_equal(a, b)
    # Not an identity-like order: few fixed points and most neighbours land far apart.
    assert (a == np.arange(n)).sum() < 20
    assert np.median(np.abs(np.diff(a))) > n / 20


def test_keys_are_stable_and_distinct():
    assert derive_key(42, "web", 3, 0) == derive_key(42, "web", 3, 0)
    assert derive_key(42, "web", 3, 0) != derive_key(42, "web", 3, 1)
    assert derive_key(42, "web", 3) != derive_key(42, "web3")


@given(key=st.integers(0, 2**64 - 1), n=st.integers(1, 10_000))
def test_hash_index_is_in_range(key, n):
    for counter in range(20):
        assert 0 <= hash_index(key, counter, n) < n


def test_hash_index_spreads_evenly():
    counts = np.bincount([hash_index(99, c, 10) for c in range(20_000)], minlength=10)
    assert counts.min() > 1800 and counts.max() < 2200


@given(key=st.integers(0, 2**64 - 1), start=st.integers(0, 2**40), n=st.integers(1, 10**9))
def test_vector_hashes_match_the_scalar_ones(key, start, n):
    from fmsdata.util.permute import hash_values

    values = hash_values(key, start, 5)
    assert [v % n for v in values] == [hash_index(key, start + i, n) for i in range(5)]


def test_round_constants_equal_the_per_key_rule():
    """The compiled round constants equal the rule written one key at a time."""
    from fmsdata.util.permute import _ROUNDS, _mix_int, _round_constants

    keys = [derive_key(i) for i in range(50)] + [0, (1 << 64) - 1]
    sizes = np.arange(len(keys)) * 977 + 1
    sizes[-1] = 0  # an empty range: no bits, like a range of one
    bits, table = _round_constants(sizes, np.array(keys, dtype=np.uint64))
    assert bits.tolist() == [int(max(n - 1, 0)).bit_length() for n in sizes]
    expected = []
    for key, b in zip(keys, bits.tolist()):
        mask, state, row = (1 << b) - 1, key, []
        for _ in range(_ROUNDS):
            state = _mix_int(state + 0x9E3779B97F4A7C15)
            row.append(state & mask)
            state = _mix_int(state + 0x9E3779B97F4A7C15)
            row.append((state & mask) | 1)
        expected.append(row)
    assert table.tolist() == expected


def reference_position(position, n, key):
    """Position ``position`` of the keyed permutation of ``range(n)``, in Python ints one
    round at a time (the rule ``Permutations.apply`` compiles)."""
    from fmsdata.util.permute import _ROUNDS, _mix_int

    if n <= 1:
        return 0
    bits = (n - 1).bit_length()
    mask, shift, state, rounds = (1 << bits) - 1, (bits + 1) >> 1, key, []
    for _ in range(_ROUNDS):
        state = _mix_int(state + 0x9E3779B97F4A7C15)
        addend = state & mask
        state = _mix_int(state + 0x9E3779B97F4A7C15)
        rounds.append((addend, (state & mask) | 1))
    x = position
    while True:
        for addend, multiplier in rounds:
            x = (x + addend) & mask
            x = (x * multiplier) & mask
            x ^= x >> shift
        if x < n:
            return x


@given(
    sizes=st.lists(st.integers(1, 2**40), min_size=1, max_size=6),
    keys=st.lists(st.integers(0, 2**64 - 1), min_size=6, max_size=6),
    picks=st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1, exclude_max=True)), max_size=40),
)
def test_permutations_apply_matches_a_position_by_position_reference(sizes, keys, picks):
    from fmsdata.util.permute import Permutations

    orders = Permutations(sizes, keys[: len(sizes)])
    groups = np.array([g % len(sizes) for g, _ in picks], dtype=np.int64)
    positions = np.array([int(u * sizes[g]) for g, (_, u) in zip(groups, picks)], dtype=np.int64)
    got = orders.apply(positions, groups).tolist()
    assert got == [reference_position(int(p), sizes[g], keys[g]) for p, g in zip(positions, groups)]
