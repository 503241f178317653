"""SimFL's LSH kernels against their numpy references, and the parameter rules."""

import numpy as np
import pytest

from fedgrove.exceptions import InvalidParameterError
from fedgrove.protocols.simfl.lsh import (LSHFamily, LSHParams, hash_values, hash_values_reference, quantize,
                                          similar_instances, similar_instances_reference)


def test_quantize_bins_equal_width_between_the_shared_range(rng):
    X = np.array([[0.0, 5.0, np.nan], [10.0, 5.0, 1.0], [2.5, 5.0, 2.0]])
    b = quantize(X, np.array([0.0, 5.0, 0.0]), np.array([10.0, 5.0, 4.0]), 4)
    np.testing.assert_array_equal(b, [[0, 0, 4], [3, 0, 1], [1, 0, 2]])  # max in the last bin; NaN -> n_bins


@pytest.mark.parametrize("distribution", ["cauchy", "gaussian"])
def test_hash_kernel_equals_reference(rng, distribution):
    X = rng.integers(0, 257, size=(200, 12)).astype(float)
    fam = LSHFamily.draw(LSHParams(distribution=distribution, seed=3), 12)
    assert fam.a.shape == (11, 12)  # L = min(40, d - 1)
    np.testing.assert_array_equal(hash_values(X, fam.a, fam.b, fam.r), hash_values_reference(X, fam.a, fam.b, fam.r))


def test_similar_instance_is_the_most_colliding_with_ties_to_the_lowest_id(rng):
    # small hash alphabet: many ties and partial collisions; some rows collide with nothing
    H_other = rng.integers(0, 3, size=(60, 5))
    H_query = np.vstack([rng.integers(0, 3, size=(40, 5)), np.full((3, 5), 99)])
    ids = rng.permutation(1000)[:60]
    got = similar_instances(H_query, H_other, ids)
    np.testing.assert_array_equal(got, similar_instances_reference(H_query, H_other, ids))
    assert (got[-3:] == -1).all() and (got[:-3] >= 0).all()
    # an exact duplicate row wins over partial matches
    H_query2 = H_other[[7, 30]]
    best = similar_instances(H_query2, H_other, ids)
    for q, b in zip((7, 30), best):
        dup = np.nonzero((H_other == H_other[q]).all(axis=1))[0]
        assert b == dup[np.argmin(ids[dup])]


def test_duplicate_rows_on_both_sides_give_the_direct_answer(rng):
    # the search runs over distinct rows (each other party's row standing for its lowest ID): with rows repeated
    # many times over, as KDD Cup 99's, the answer is still the direct pairwise one, lowest ID on ties
    base_other = rng.integers(0, 3, size=(12, 5))
    base_query = np.vstack([base_other[:4], rng.integers(0, 3, size=(6, 5)), np.full((1, 5), 7)])
    H_other = base_other[rng.integers(0, 12, 400)]
    H_query = base_query[rng.integers(0, 11, 300)]
    ids = rng.permutation(10_000)[:400]
    got = similar_instances(H_query, H_other, ids)
    np.testing.assert_array_equal(got, similar_instances_reference(H_query, H_other, ids))
    assert (got[(H_query == 7).all(axis=1)] == -1).all()
    assert len(similar_instances(H_query[:0], H_other, ids)) == 0
    assert (similar_instances(H_query, H_other[:0], ids[:0]) == -1).all()


def test_similar_instances_in_blocks_of_query_rows_report_progress_and_give_the_same_answer(rng, monkeypatch):
    from fedgrove.protocols.simfl import lsh

    H_other = rng.integers(0, 4, size=(80, 6))
    H_query = rng.integers(0, 4, size=(40, 6))
    H_query[5:10] = H_query[0]  # duplicates
    H_query = np.vstack([H_query, H_query[:5]])
    ids = rng.permutation(500)[:80]
    whole = similar_instances(H_query, H_other, ids)
    monkeypatch.setattr(lsh, "QUERY_BLOCK", 7)
    seen = []
    np.testing.assert_array_equal(similar_instances(H_query, H_other, ids, progress=lambda d, n: seen.append((d, n))),
                                  whole)
    # a call per block of 7 distinct rows, counting the query rows they stand for
    distinct = len(np.unique(H_query, axis=0))
    assert distinct <= 36 and len(seen) == -(-distinct // 7)
    done = [d for d, _ in seen]
    assert all(n == 45 for _, n in seen) and done == sorted(set(done)) and done[-1] == 45
    np.testing.assert_array_equal(whole, similar_instances_reference(H_query, H_other, ids))


def test_a_long_similarity_search_is_noted_with_its_progress(monkeypatch, caplog):
    # 2 x 500,000 rows took 100 s on this 2-core machine with nothing said
    import logging
    from types import SimpleNamespace

    from fedgrove.protocols.simfl import party

    clock = [1000.0]
    monkeypatch.setattr(party.time, "monotonic", lambda: clock[0])
    me = SimpleNamespace(ch=SimpleNamespace(party="party0"))
    note = party.SimFLParty._similarity_note(me, "party1", 500_000)
    with caplog.at_level(logging.INFO, logger="fedgrove"):
        for t, done in ((10, 50_000), (16, 100_000), (30, 150_000), (47, 250_000), (60, 499_000), (80, 500_000)):
            clock[0] = 1000.0 + t
            note(done, 500_000)
    assert [r.getMessage() for r in caplog.records] == [
        "party0: similar instances among party1's 500000: 100000 of 500000 rows done (16 s so far)",
        "party0: similar instances among party1's 500000: 250000 of 500000 rows done (47 s so far)"]


def test_more_hash_functions_than_features_are_refused_unless_forced():
    with pytest.raises(InvalidParameterError, match="L < d"):
        LSHParams(n_hashes=8).resolve(8)
    assert LSHParams(n_hashes=8, force=True).resolve(8) == 8
    assert LSHParams().resolve(123) == 40 and LSHParams().resolve(9) == 8
    with pytest.raises(InvalidParameterError, match="distribution"):
        LSHParams(distribution="laplace")
    with pytest.raises(InvalidParameterError, match="r must be a positive, finite number, got inf"):
        LSHParams(r=float("inf"))  # b ~ U(0, r) has no meaning there
    for seed, message in ((-1, "LSH seed must be >= 0, got -1"), (1.5, "LSH seed must be an integer, got 1.5")):
        with pytest.raises(InvalidParameterError, match=message):
            LSHParams(seed=seed)  # numpy refused it inside a party's thread


def test_rows_are_grouped_exactly_even_when_their_digests_collide(rng):
    # distinct rows are told apart by comparing them in full within a run of equal digests: with every digest
    # made equal, the groups are still exactly the sets of equal rows
    from fedgrove.protocols.simfl.lsh import _distinct_rows, _groups_by_digest

    H = rng.integers(-2, 2, size=(300, 3))
    expected = np.unique(H, axis=0, return_inverse=True)[1].reshape(-1)
    for group, n_groups in (_distinct_rows(H), _groups_by_digest(H, np.zeros(300, dtype=np.uint64),
                                                                  np.arange(300))):
        assert n_groups == len(np.unique(expected))
        pairs = set(zip(group.tolist(), expected.tolist()))
        assert len(pairs) == n_groups  # one to one with numpy's grouping
