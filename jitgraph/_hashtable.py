"""Open-addressing hash set / hash map over int64 keys, held in typed arrays.

Used by every jitted graph pass (visited sets, node -> gradient maps,
replacement maps).  A table is a plain tuple ``(keys, vals, used, meta)`` so it
can travel in and out of nopython code:

* ``keys``/``vals`` -- int64 arrays, capacity a power of two;
* ``used``          -- uint8 occupancy marker per slot.  Occupancy is explicit,
  so every int64 (0, negatives, INT64_MIN) is a valid key;
* ``meta``          -- int64[2]: number of keys, capacity - 1 (the probe mask).

Linear probing.  The load factor never passes 1/2, so a probe always ends at a
free slot: ``ht_insert`` / ``hs_add`` refuse with FULL instead, and the owner
calls ``ht_grow`` (double and rehash).  ``ht_put`` / ``hs_put`` do both.

Why the split: a loop that may rebind its table pays Numba's reference counting
on every iteration (measured 4x slower), so the graph passes size their tables
to a proven bound up front (a pass visits each node at most once) and keep the
rebinding out of their hot loops.
"""
import numpy as np
from numba import njit

# status codes
FOUND = 0
NOT_FOUND = 1
INSERTED = 2
UPDATED = 3
FULL = 4

_MIN_CAPACITY = 8


@njit(cache=True)
def ht_new(expected_keys):
    """An empty table that takes ``expected_keys`` keys without growing."""
    cap = _MIN_CAPACITY
    while cap < 2 * max(expected_keys, 0) + 2:
        cap *= 2
    keys = np.empty(cap, np.int64)
    vals = np.empty(cap, np.int64)
    used = np.zeros(cap, np.uint8)
    meta = np.zeros(2, np.int64)
    meta[1] = cap - 1
    return (keys, vals, used, meta)


@njit(cache=True)
def _hash(key):
    # Keys are node ids: dense, small, visited in near order.  Identity on the low
    # bits keeps neighbouring ids in neighbouring slots (cache-friendly, and no
    # collisions at all for dense keys); high bits are folded in so any int64 works.
    z = np.uint64(key)
    z = z ^ (z >> np.uint64(20)) ^ (z >> np.uint64(40))
    return np.int64(z & np.uint64(0x7FFFFFFFFFFFFFFF))


@njit(cache=True)
def ht_slot(table, key):
    """Slot holding ``key``, or -(free slot) - 1 where it would go."""
    keys, vals, used, meta = table
    mask = meta[1]
    i = _hash(key) & mask
    while used[i]:
        if keys[i] == key:
            return i
        i = (i + 1) & mask
    return -i - 1


@njit(cache=True)
def ht_contains(table, key):
    return ht_slot(table, key) >= 0


@njit(cache=True)
def ht_get(table, key):
    """(FOUND, value) or (NOT_FOUND, 0)."""
    s = ht_slot(table, key)
    if s < 0:
        return NOT_FOUND, np.int64(0)
    return FOUND, table[1][s]


@njit(cache=True)
def ht_get_or(table, key, default):
    s = ht_slot(table, key)
    if s < 0:
        return default
    return table[1][s]


@njit(cache=True)
def ht_insert(table, key, val):
    """Set ``key -> val``: INSERTED, UPDATED, or FULL (nothing done: ht_grow first)."""
    s = ht_slot(table, key)
    if s >= 0:
        table[1][s] = val
        return UPDATED
    meta = table[3]
    if 2 * (meta[0] + 1) > meta[1] + 1:
        return FULL
    i = -s - 1
    table[0][i] = key
    table[1][i] = val
    table[2][i] = 1
    meta[0] += 1
    return INSERTED


@njit(cache=True)
def hs_add(table, key):
    """Set insert: INSERTED for a new key, FOUND if present, FULL (ht_grow first)."""
    s = ht_slot(table, key)
    if s >= 0:
        return FOUND
    meta = table[3]
    if 2 * (meta[0] + 1) > meta[1] + 1:
        return FULL
    i = -s - 1
    table[0][i] = key
    table[1][i] = 0
    table[2][i] = 1
    meta[0] += 1
    return INSERTED


@njit(cache=True)
def ht_grow(table):
    """A table of twice the capacity holding the same keys and values."""
    keys, vals, used, meta = table
    new_cap = 2 * (meta[1] + 1)
    nkeys = np.empty(new_cap, np.int64)
    nvals = np.empty(new_cap, np.int64)
    nused = np.zeros(new_cap, np.uint8)
    nmeta = np.zeros(2, np.int64)
    nmeta[0] = meta[0]
    nmeta[1] = new_cap - 1
    mask = new_cap - 1
    for s in range(keys.size):
        if used[s]:
            i = _hash(keys[s]) & mask
            while nused[i]:
                i = (i + 1) & mask
            nused[i] = 1
            nkeys[i] = keys[s]
            nvals[i] = vals[s]
    return (nkeys, nvals, nused, nmeta)


@njit(cache=True)
def ht_put(table, key, val):
    """ht_insert that grows when needed: returns (table, INSERTED | UPDATED)."""
    st = ht_insert(table, key, val)
    if st == FULL:
        table = ht_grow(table)
        st = ht_insert(table, key, val)
    return table, st


@njit(cache=True)
def hs_put(table, key):
    """hs_add that grows when needed: returns (table, INSERTED | FOUND)."""
    st = hs_add(table, key)
    if st == FULL:
        table = ht_grow(table)
        st = hs_add(table, key)
    return table, st


@njit(cache=True)
def ht_clear(table):
    """Forget every key, keeping the capacity (tables are reused across passes)."""
    table[2][:] = 0
    table[3][0] = 0


@njit(cache=True)
def ht_len(table):
    return table[3][0]


@njit(cache=True)
def ht_capacity(table):
    return table[3][1] + 1


@njit(cache=True)
def ht_items(table):
    """Keys and values in slot order (for tests and debugging)."""
    keys, vals, used, meta = table
    n = meta[0]
    k = np.empty(n, np.int64)
    v = np.empty(n, np.int64)
    j = 0
    for s in range(keys.size):
        if used[s]:
            k[j] = keys[s]
            v[j] = vals[s]
            j += 1
    return k, v
