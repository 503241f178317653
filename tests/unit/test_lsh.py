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


def test_more_hash_functions_than_features_are_refused_unless_forced():
    with pytest.raises(InvalidParameterError, match="L < d"):
        LSHParams(n_hashes=8).resolve(8)
    assert LSHParams(n_hashes=8, force=True).resolve(8) == 8
    assert LSHParams().resolve(123) == 40 and LSHParams().resolve(9) == 8
    with pytest.raises(InvalidParameterError, match="distribution"):
        LSHParams(distribution="laplace")
