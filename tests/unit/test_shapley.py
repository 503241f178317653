"""Split Shapley values: the properties that make them fair, exact and sampled."""

import numpy as np
import pytest

from fedgrove.ledger.contributions import (exact_shapley_values, shapley_values, split_sums, utility,
                                           vote_contributions)


def _sums(rng, m):
    s = np.abs(rng.normal(size=(m, 4))) * 10
    s[:, 0] *= -1  # left gradient sums negative, right positive: a useful split
    return s


@pytest.mark.parametrize("m", [1, 3, 6])
def test_efficiency_values_add_up_to_the_split_gain(rng, m):
    s = _sums(rng, m)
    phi, se, method = shapley_values(s, reg_lambda=1.0, gamma=0.5)
    assert method == "exact" and np.all(se == 0)
    assert phi.sum() == pytest.approx(utility(s.sum(axis=0), 1.0, 0.5))


@pytest.mark.parametrize("m", [1, 2, 4, 5])
def test_exact_values_are_the_mean_marginal_utility_over_every_order_of_the_parties(rng, m):
    import itertools
    import math

    s = _sums(rng, m)
    s[0, 1] = 0.0  # a side with no hessian: with lambda 0 its score is 0, not 0/0
    for lam, gamma in ((1.0, 0.5), (0.0, 0.0)):
        want = np.zeros(m)
        for order in itertools.permutations(range(m)):
            before = 0.0
            for k, i in enumerate(order):
                now = float(utility(s[list(order[:k + 1])].sum(axis=0), lam, gamma))
                want[i] += now - before
                before = now
        np.testing.assert_allclose(shapley_values(s, lam, gamma)[0], want / math.factorial(m), rtol=1e-12,
                                   atol=1e-12)


def test_a_layers_splits_computed_together_give_each_splits_values_bit_for_bit(rng):
    # the horizontal aggregator computes a tree's splits in one call; a check may recompute each on its own
    sums = np.stack([_sums(rng, 4) for _ in range(30)])
    together = exact_shapley_values(sums, 1.0, 0.1)
    for k in range(30):
        assert np.array_equal(together[k], shapley_values(sums[k], 1.0, 0.1)[0])
    with pytest.raises(ValueError, match=r"party sums are \(splits, parties, 4\), got shape \(4, 4\)"):
        exact_shapley_values(sums[0], 1.0)


def test_symmetry_and_null_player(rng):
    s = _sums(rng, 4)
    s[2] = s[0]          # two parties with identical histograms
    s[3] = 0.0           # a party whose gradients are all zero
    phi, _, _ = shapley_values(s, 1.0)
    assert phi[0] == pytest.approx(phi[2]) and phi[3] == pytest.approx(0.0, abs=1e-12)


def test_sampled_values_agree_with_exact_within_the_reported_error(rng, monkeypatch):
    import fedgrove.ledger.contributions as c

    s = _sums(rng, 8)
    exact, _, _ = shapley_values(s, 1.0)
    monkeypatch.setattr(c, "EXACT_MAX", 4)  # force sampling for 8 parties
    sampled, se, method = c.shapley_values(s, 1.0, n_permutations=4000, seed=1)
    assert method == "sampled" and np.all(se > 0)
    assert np.all(np.abs(sampled - exact) < 4 * se + 1e-9)
    assert sampled.sum() == pytest.approx(exact.sum())  # every permutation adds up to the grand coalition's gain


def test_split_sums_and_vote_shares():
    hist = np.array([[-2.0, 1.0, 3], [1.0, 0.5, 2], [4.0, 2.0, 5], [-1.0, 0.5, 1]])  # three value bins + missing
    np.testing.assert_allclose(split_sums(hist, 1, missing_left=False), [-1.0, 1.5, 3.0, 2.5])
    np.testing.assert_allclose(split_sums(hist, 1, missing_left=True), [-2.0, 2.0, 4.0, 2.0])
    np.testing.assert_allclose(vote_contributions(6.0, np.array([True, False, True])), [3.0, 0.0, 3.0])
    assert not vote_contributions(-1.0, np.array([True])).any()


def test_lambda_zero_gives_finite_values_where_a_coalition_has_no_instances_on_a_side():
    # with reg_lambda 0 the empty coalition's score was 0/0: every party's value was NaN, the ledger recorded
    # NaN and `fedgrove ledger verify` refused it (NaN recomputes as no value equals NaN)
    sums = np.array([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0], [-1.0, 1.0, 2.0, 2.0]])
    phi, _, _ = shapley_values(sums, reg_lambda=0.0)
    assert np.all(np.isfinite(phi)) and phi[1] == 0.0  # the party without instances is a null player
    assert phi.sum() == pytest.approx(utility(sums.sum(axis=0), 0.0, 0.0))
    assert utility(np.zeros(4), 0.0, 0.0) == 0.0
