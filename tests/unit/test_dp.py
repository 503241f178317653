import numpy as np
import pytest

from fedgrove.crypto.dp import PrivacyAccountant, exponential, laplace
from fedgrove.exceptions import PrivacyBudgetError


def test_accountant_sums_sequential_maxes_parallel_and_refuses_overspend():
    acc = PrivacyAccountant(1.0)
    acc.spend(0.25, "votes")
    with acc.parallel():
        for _ in range(5):  # five disjoint nodes of one depth
            acc.spend(0.5, "node histogram")
    assert acc.spent == pytest.approx(0.75)
    with pytest.raises(PrivacyBudgetError, match="over the budget of 1"):
        acc.spend(0.3, "one more")
    assert acc.spent == pytest.approx(0.75)
    acc.spend(0.25)
    assert acc.spent == pytest.approx(1.0) and "1 of 1" in acc.report()


def test_laplace_noise_has_the_configured_scale():
    noisy = laplace(np.zeros(20000), sensitivity=2.0, epsilon=0.5)  # OpenDP sampler, scale 4
    assert abs(np.mean(np.abs(noisy)) - 4.0) < 0.25
    seeded = laplace(np.zeros(5), 1.0, 1.0, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(seeded, laplace(np.zeros(5), 1.0, 1.0, rng=np.random.default_rng(3)))


def test_exponential_mechanism_prefers_high_scores():
    scores = np.array([0.0, 10.0, 0.0, 1.0])
    picks = [exponential(scores, 1.0, 8.0) for _ in range(60)]
    assert np.mean(np.array(picks) == 1) > 0.9
    acc = PrivacyAccountant(0.1)
    with pytest.raises(PrivacyBudgetError):
        exponential(scores, 1.0, 0.2, accountant=acc)


def test_nested_parallel_blocks_compose_like_the_fvtree_schedule():
    # two ensembles in sequence; in each, trees on disjoint data; in a tree, depths in sequence; in a depth,
    # nodes on disjoint data; a node's five queries in sequence
    acc = PrivacyAccountant(1.0)
    per_query = 1.0 / (2 * 3 * 5)
    for _ensemble in range(2):
        with acc.parallel():
            for tree in range(4):
                with acc.branch(tree):
                    for _depth in range(3):
                        with acc.parallel():
                            for node in range(4):
                                with acc.branch(node):
                                    for _ in range(5):
                                        acc.spend(per_query, "query")
    assert acc.spent == pytest.approx(1.0)
    with pytest.raises(PrivacyBudgetError):
        with acc.parallel():
            with acc.branch(0):
                acc.spend(per_query)
    assert acc.spent == pytest.approx(1.0)


def test_accountant_state_restores_what_was_spent_inside_an_open_block():
    from fedgrove.exceptions import InvalidParameterError

    def run(acc, trees, restore=None):
        with acc.parallel():  # an ensemble: trees on disjoint parts
            if restore is not None:
                acc.restore(restore)
            for t in trees:
                with acc.branch(("tree", t)):
                    acc.spend(0.1 * (4 - t), f"tree {t}")  # the earliest trees cost most
            return acc.state()

    full = PrivacyAccountant(2.0)
    run(full, range(4))
    first = PrivacyAccountant(2.0)
    saved = run(first, range(2))
    resumed = PrivacyAccountant(2.0)
    run(resumed, range(2, 4), restore=saved)
    assert resumed.spent == full.spent == pytest.approx(0.4)
    assert resumed.report() == full.report()  # calls before the restore counted too
    with pytest.raises(InvalidParameterError, match="other composition blocks"):
        PrivacyAccountant(2.0).restore(saved)  # taken inside an ensemble's block, restored outside any
    with pytest.raises(InvalidParameterError, match="budget 2, this run 3"):
        with PrivacyAccountant(3.0).parallel() as acc:
            acc.restore(saved)
