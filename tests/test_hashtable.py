"""Tests for jitgraph._hashtable: the open-addressing int64 hash map / set.

The table is checked against a Python dict (or set) model, on random operation
sequences and on hand-picked edge cases: extreme keys, probe collisions, the
1/2 load-factor limit (FULL), growth, clearing, and use from nopython code.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import njit

from jitgraph._hashtable import (FOUND, FULL, INSERTED, NOT_FOUND, UPDATED,
                                 hs_add, hs_put, ht_capacity, ht_clear,
                                 ht_contains, ht_get, ht_get_or, ht_grow,
                                 ht_insert, ht_items, ht_len, ht_new, ht_put,
                                 ht_slot)

INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1
EDGE_KEYS = [0, -1, 1, -2, INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1, 1 << 20, 1 << 40]


# ---- helpers ---------------------------------------------------------------------

def is_power_of_two(n):
    return n > 0 and n & (n - 1) == 0


def items_dict(t):
    """ht_items as a dict, checking on the way that no key is stored twice."""
    k, v = ht_items(t)
    assert k.size == v.size == ht_len(t)
    assert np.unique(k).size == k.size, "a key is stored in two slots"
    return dict(zip(k.tolist(), v.tolist()))


def assert_matches(t, model):
    assert ht_len(t) == len(model)
    assert items_dict(t) == model


def assert_load_ok(t):
    cap = ht_capacity(t)
    assert is_power_of_two(cap)
    assert ht_len(t) * 2 <= cap, f"load factor above 1/2: {ht_len(t)} keys in {cap} slots"


def snapshot(t):
    return tuple(a.copy() for a in t)


def assert_unchanged(t, snap):
    for a, b in zip(t, snap):
        np.testing.assert_array_equal(a, b)


def home_slot(capacity, key):
    """The slot the probe for ``key`` starts at, read off an empty table."""
    s = ht_slot(ht_new(capacity // 2 - 1), key)
    assert s < 0
    return -s - 1


# ---- random operation sequences against a dict model ------------------------------

# Full-range keys almost never repeat; a small range (and a few multiples of 64,
# which share a home slot in small tables) forces updates, hits and collisions.
keys_st = st.one_of(
    st.integers(INT64_MIN, INT64_MAX),
    st.integers(-8, 40),
    st.integers(0, 12).map(lambda k: k * 64),
    st.sampled_from(EDGE_KEYS),
)
vals_st = st.integers(INT64_MIN, INT64_MAX)

map_op_st = st.one_of(
    st.tuples(st.just("put"), keys_st, vals_st),
    st.tuples(st.just("insert"), keys_st, vals_st),     # raw ht_insert + manual grow
    st.tuples(st.just("get"), keys_st),
    st.tuples(st.just("get_or"), keys_st, vals_st),
    st.tuples(st.just("contains"), keys_st),
)


@settings(max_examples=200, deadline=None)
@given(
    expected=st.integers(0, 20),
    batches=st.lists(st.lists(map_op_st, max_size=40), min_size=1, max_size=6),
    clear_between=st.booleans(),
)
def test_map_matches_dict_model(expected, batches, clear_between):
    t = ht_new(expected)
    model = {}
    for bi, batch in enumerate(batches):
        if clear_between and bi % 2 == 1:
            ht_clear(t)
            model.clear()
        for op in batch:
            kind, key = op[0], op[1]
            if kind == "put":
                t, status = ht_put(t, key, op[2])
                assert status == (UPDATED if key in model else INSERTED)
                model[key] = op[2]
            elif kind == "insert":
                status = ht_insert(t, key, op[2])
                if status == FULL:
                    # FULL only for a new key that would push the load past 1/2
                    assert key not in model
                    assert 2 * (ht_len(t) + 1) > ht_capacity(t)
                    t = ht_grow(t)
                    status = ht_insert(t, key, op[2])
                assert status == (UPDATED if key in model else INSERTED)
                model[key] = op[2]
            elif kind == "get":
                status, val = ht_get(t, key)
                if key in model:
                    assert (status, val) == (FOUND, model[key])
                else:
                    assert status == NOT_FOUND
            elif kind == "get_or":
                assert ht_get_or(t, key, op[2]) == model.get(key, op[2])
            else:
                assert ht_contains(t, key) == (key in model)
            assert_load_ok(t)
        assert_matches(t, model)


set_op_st = st.one_of(
    st.tuples(st.just("put"), keys_st),
    st.tuples(st.just("add"), keys_st),                 # raw hs_add + manual grow
    st.tuples(st.just("contains"), keys_st),
)


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.lists(set_op_st, max_size=40), min_size=1, max_size=6))
def test_set_matches_set_model(batches):
    t = ht_new(0)
    model = set()
    for batch in batches:
        for kind, key in batch:
            if kind == "put":
                t, status = hs_put(t, key)
                assert status == (FOUND if key in model else INSERTED)
                model.add(key)
            elif kind == "add":
                status = hs_add(t, key)
                if status == FULL:
                    assert key not in model
                    assert 2 * (ht_len(t) + 1) > ht_capacity(t)
                    t = ht_grow(t)
                    status = hs_add(t, key)
                assert status == (FOUND if key in model else INSERTED)
                model.add(key)
            else:
                assert ht_contains(t, key) == (key in model)
            assert_load_ok(t)
        k, _ = ht_items(t)
        assert ht_len(t) == len(model)
        assert sorted(k.tolist()) == sorted(model)


# ---- keys: every int64 is a valid key ------------------------------------------------

def test_extreme_and_negative_keys():
    # occupancy is explicit, so no key value doubles as an "empty" sentinel
    t = ht_new(4)
    for k in EDGE_KEYS:
        assert not ht_contains(t, k)
        assert ht_get(t, k)[0] == NOT_FOUND
    model = {}
    for i, k in enumerate(EDGE_KEYS):
        t, status = ht_put(t, k, -i - 1)
        assert status == INSERTED
        model[k] = -i - 1
        assert_load_ok(t)
    assert_matches(t, model)
    for k, v in model.items():
        assert ht_get(t, k) == (FOUND, v)
        assert ht_contains(t, k)
    # a fresh table (np.empty keys may hold anything) never reports 0 or -1 present
    for k in (0, -1, INT64_MIN):
        assert not ht_contains(ht_new(100), k)


def test_values_are_full_int64():
    t = ht_new(3)
    for k, v in [(1, INT64_MIN), (2, INT64_MAX), (3, 0)]:
        assert ht_insert(t, k, v) == INSERTED
    assert items_dict(t) == {1: INT64_MIN, 2: INT64_MAX, 3: 0}


# ---- collisions ----------------------------------------------------------------------

def test_dense_keys_do_not_collide():
    # design property (see _hash): small dense ids land in their own slot
    t = ht_new(31)
    cap = ht_capacity(t)
    for k in range(cap // 2):
        assert ht_insert(t, k, k) == INSERTED
    for k in range(cap // 2):
        assert ht_slot(t, k) == k


@pytest.mark.parametrize("capacity", [8, 64, 1024])
@pytest.mark.parametrize("home", ["first", "last"])
def test_colliding_keys(capacity, home):
    # Keys base + j*capacity all start probing at the same slot.  With home at
    # the last slot the probe run wraps around to slot 0.
    base = 0 if home == "first" else capacity - 1
    n = capacity // 2                      # fills the table to its load limit
    keys = [base + j * capacity for j in range(n + 3)]
    present, absent = keys[:n], keys[n:]
    assert len({home_slot(capacity, k) for k in keys}) == 1, "test keys should share a home slot"

    t = ht_new(n - 1)                       # ht_new leaves room for one key more
    assert ht_capacity(t) == capacity
    for j, k in enumerate(present):
        s = ht_slot(t, k)
        assert s < 0 and t[2][-s - 1] == 0     # the reported free slot is free
        assert ht_insert(t, k, 1000 + j) == INSERTED
        assert ht_slot(t, k) == -s - 1         # ... and the key went there
    assert ht_insert(t, absent[0], 0) == FULL
    for j, k in enumerate(present):
        assert ht_get(t, k) == (FOUND, 1000 + j)
    for k in absent:
        # the probe walks the whole cluster and must stop at a free slot
        assert ht_get(t, k)[0] == NOT_FOUND
        assert not ht_contains(t, k)
        assert ht_get_or(t, k, -7) == -7
    # the same holds once the cluster is rehashed into a larger table
    g = ht_grow(t)
    for j, k in enumerate(present):
        assert ht_get(g, k) == (FOUND, 1000 + j)
    for k in absent:
        assert ht_get(g, k)[0] == NOT_FOUND


def test_high_bits_folded_into_hash():
    # Keys that differ only above bit 20 or bit 40 must still be told apart,
    # including pairs the fold sends to the same slot of a small table.
    keys = [1, 1 << 20, (1 << 20) | 1, 1 << 40, (1 << 40) | (1 << 20), INT64_MIN, 0,
            INT64_MIN | 1, 3 << 60]
    assert home_slot(8, 1) == home_slot(8, 1 << 20), "test premise: these collide"
    assert home_slot(8, 0) == home_slot(8, INT64_MIN), "test premise: these collide"
    t = ht_new(0)
    for i, k in enumerate(keys):
        t, _ = ht_put(t, k, i)
    assert items_dict(t) == {k: i for i, k in enumerate(keys)}
    for k in (2 << 20, 5 << 40, 1 << 62):
        assert not ht_contains(t, k)


# ---- load factor, FULL and growth -------------------------------------------------------

@pytest.mark.parametrize("expected", [0, 1, 3, 4, 5, 100, 1000])
def test_new_table_takes_expected_keys_without_growing(expected):
    t = ht_new(expected)
    cap = ht_capacity(t)
    assert is_power_of_two(cap) and cap >= 8
    assert ht_len(t) == 0
    for k in range(expected):
        assert ht_insert(t, k * 7919 - 5, k) == INSERTED
    assert ht_capacity(t) == cap


def test_insert_full_exactly_at_half_load():
    t = ht_new(0)
    cap = ht_capacity(t)
    limit = cap // 2
    for k in range(limit):
        assert ht_insert(t, -k, k) == INSERTED
        assert_load_ok(t)
    assert ht_len(t) == limit
    # one more new key would make the load exceed 1/2: refused, table untouched
    snap = snapshot(t)
    for new_key in (limit, -limit, INT64_MAX, INT64_MIN):
        assert ht_insert(t, new_key, 99) == FULL
        assert hs_add(t, new_key) == FULL
        assert_unchanged(t, snap)
        assert not ht_contains(t, new_key)
    # existing keys may still be updated (or found) at the limit
    assert ht_insert(t, 0, 42) == UPDATED
    assert hs_add(t, -1) == FOUND
    assert ht_get(t, 0) == (FOUND, 42)
    assert ht_len(t) == limit


def test_full_never_before_the_limit():
    # fill tables of several sizes one key at a time; FULL appears exactly when
    # 2 * (len + 1) > capacity, never earlier
    for expected in (0, 7, 50):
        t = ht_new(expected)
        cap = ht_capacity(t)
        for k in range(cap):
            status = ht_insert(t, k * 1_000_003, k)
            if 2 * (k + 1) > cap:
                assert status == FULL
                break
            assert status == INSERTED
        assert ht_len(t) == cap // 2


def test_grow_keeps_everything():
    t = ht_new(0)
    model = {}
    rng = np.random.default_rng(0)
    for key in rng.integers(INT64_MIN, INT64_MAX, size=4, dtype=np.int64, endpoint=True).tolist():
        assert ht_insert(t, key, key // 3) == INSERTED
        model[key] = key // 3
    for _ in range(6):
        cap = ht_capacity(t)
        before = snapshot(t)
        g = ht_grow(t)
        assert_unchanged(t, before)            # the old table is left alone
        assert ht_capacity(g) == 2 * cap
        assert is_power_of_two(ht_capacity(g))
        assert_matches(g, model)
        # the grown table accepts new keys up to its own limit
        while 2 * (ht_len(g) + 1) <= ht_capacity(g):
            key = int(rng.integers(INT64_MIN, INT64_MAX, dtype=np.int64, endpoint=True))
            status = ht_insert(g, key, 5)
            assert status == (UPDATED if key in model else INSERTED)
            model[key] = 5
        t = g
    assert_matches(t, model)


def test_put_grows_and_keeps_load_at_most_half():
    t = ht_new(0)
    model = {}
    caps = set()
    for i in range(2000):
        key = (i * 2654435761) ^ -(i & 1)      # spread, half of them negative
        t, status = ht_put(t, key, i)
        assert status == INSERTED
        model[key] = i
        assert_load_ok(t)
        caps.add(ht_capacity(t))
    assert max(caps) == 4096                    # smallest power of two >= 2 * 2000
    assert_matches(t, model)


# ---- updates and clearing ----------------------------------------------------------

def test_update_replaces_value():
    t = ht_new(2)
    assert ht_insert(t, -5, 1) == INSERTED
    assert ht_insert(t, -5, 2) == UPDATED
    t, status = ht_put(t, -5, 3)
    assert status == UPDATED
    assert ht_get(t, -5) == (FOUND, 3)
    assert ht_len(t) == 1
    t, status = hs_put(t, -5)                    # set-add of a present key changes nothing
    assert status == FOUND
    assert ht_get(t, -5) == (FOUND, 3)


def test_clear_empties_and_table_is_reusable():
    t = ht_new(0)
    for k in range(-50, 50):
        t, _ = ht_put(t, k, k * k)
    cap = ht_capacity(t)
    ht_clear(t)
    assert ht_len(t) == 0
    assert ht_capacity(t) == cap
    assert ht_items(t)[0].size == 0
    for k in range(-50, 50):
        assert not ht_contains(t, k)
        assert ht_get(t, k)[0] == NOT_FOUND
    # refill with a subset and new values: no stale value resurfaces
    model = {}
    for k in range(-50, 50, 3):
        assert ht_insert(t, k, -k) == INSERTED
        model[k] = -k
    assert_matches(t, model)
    for k in range(-50, 50):
        if k not in model:
            assert not ht_contains(t, k)
    # the FULL limit is counted from zero again
    while ht_insert(t, 10_000 + ht_len(t), 0) != FULL:
        pass
    assert ht_len(t) == cap // 2
    assert ht_capacity(t) == cap


# ---- use from nopython code ------------------------------------------------------------

@njit(cache=True)
def _fill_with_grow(n):
    """Insert n distinct keys into a minimal table, growing on FULL; then look
    them all up.  Returns (keys found with the right value, grows, len, cap)."""
    t = ht_new(0)
    grows = 0
    for i in range(n):
        key = (i - n // 2) * 2654435761         # negatives, large, spread
        status = ht_insert(t, key, 3 * i)
        if status == FULL:
            t = ht_grow(t)
            grows += 1
            status = ht_insert(t, key, 3 * i)
        if status != INSERTED:
            return -1, grows, ht_len(t), ht_capacity(t)
    found = 0
    for i in range(n):
        key = (i - n // 2) * 2654435761
        status, val = ht_get(t, key)
        if status == FOUND and val == 3 * i:
            found += 1
    # keys that were never inserted
    for i in range(1, 1001):
        if ht_contains(t, (n - n // 2 + i) * 2654435761):
            found = -2
    return found, grows, ht_len(t), ht_capacity(t)


def test_jitted_insert_with_grow_and_retry():
    n = 100_000
    found, grows, length, cap = _fill_with_grow(n)
    assert found == n
    assert length == n
    assert cap == 262_144                       # smallest power of two >= 2n
    assert grows == 15                          # 8 -> 262144 is 15 doublings


@njit(cache=True)
def _count_statuses(n, distinct):
    """ht_put / hs_put in nopython mode with repeated keys."""
    t = ht_new(0)
    s = ht_new(0)
    inserted = updated = found = 0
    for i in range(n):
        key = -(i % distinct)
        t, status = ht_put(t, key, i)
        if status == INSERTED:
            inserted += 1
        elif status == UPDATED:
            updated += 1
        s, status = hs_put(s, key)
        if status == FOUND:
            found += 1
    # the last write wins: key -(j) was last written at the largest i = j mod distinct
    last_ok = 0
    for j in range(distinct):
        i_last = n - 1 - ((n - 1 - j) % distinct)
        if ht_get_or(t, -j, -1) == i_last:
            last_ok += 1
    return inserted, updated, found, last_ok, ht_len(t), ht_len(s)


def test_jitted_put_counts():
    n, distinct = 50_000, 777
    assert _count_statuses(n, distinct) == (distinct, n - distinct, n - distinct, distinct,
                                             distinct, distinct)
