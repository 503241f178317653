"""Privacy for FV-tree as a plug-in: the training loop calls the same methods whether or not there is any.

:class:`NoPrivacy` votes for the best feature and releases histograms as they
are.  :class:`DifferentialPrivacy` votes with the exponential mechanism (gain
sensitivity ``3 g*^2``), adds Laplace noise to histogram (g, h) sums
(sensitivity ``g* + h*``), counts (sensitivity 1) and the root's totals, and
accounts for every query with a :class:`~fedgrove.crypto.dp.PrivacyAccountant`:

* trees are grown in ensembles ("ensembles of ensembles"): within one
  ensemble each boosting round uses a disjoint part of every party's
  instances (parallel composition), ensembles compose in sequence, so each
  round may spend ``epsilon / n_ensembles``;
* a multiclass model's round grows one tree per class, all on the round's
  part of the data: they compose in sequence, so each spends
  ``epsilon / n_ensembles / n_classes``;
* within a tree the depths compose in sequence (``/ max_depth`` each) and the
  nodes of one depth in parallel (disjoint instances);
* a node's queries share its depth's budget: one vote and, per candidate
  feature, one (g, h) histogram and one count histogram (five queries with
  two candidates, as the paper); the root's totals are one more at depth 0.
  When the votes leave a node fewer candidates, their histograms share the
  rest, so every depth spends its share.

The accountant refuses, with :class:`~fedgrove.exceptions.PrivacyBudgetError`,
any query beyond the configured epsilon: with ``n_ensembles`` fixed too low
for the number of trees, training stops there.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np

from fedgrove.crypto.dp import PrivacyAccountant, exponential, laplace
from fedgrove.engine.params import Flag, Interval, validate
from fedgrove.engine.split import best_index
from fedgrove.exceptions import InvalidParameterError


@dataclass
class DPOptions:
    """FV-tree's differential privacy (``FVTreeOptions(dp=DPOptions(epsilon=...))``): a total budget
    ``epsilon`` per party over the whole training, spent as this module describes; a query beyond it stops
    training with a PrivacyBudgetError."""

    epsilon: float
    trees_per_ensemble: int | None = None   # boosting rounds (of one tree a class) per ensemble; default: all
    n_ensembles: int | None = None          # default: enough ensembles for every round
    g_clip: float = 1.0                     # |g| is clipped to g*, h to [0, g*]
    leaf_clip: float | None = 1.0           # |leaf value| (before the learning rate) at most this: post-processing
    #                                         of the noisy sums, no budget; None: no bound
    seeded: bool = True                     # numpy noise from the run's seed (reproducible; not floating-point
    #                                         safe); False: OpenDP's exact samplers

    def __post_init__(self):
        if not (isinstance(self.epsilon, (int, float)) and not isinstance(self.epsilon, bool) and self.epsilon > 0
                and math.isfinite(self.epsilon)):
            raise InvalidParameterError(f"dp epsilon must be a positive number, got {self.epsilon!r}")
        validate(self, {"trees_per_ensemble": Interval(int, 1, allow_none=True),
                        "n_ensembles": Interval(int, 1, allow_none=True),
                        "g_clip": Interval(float, 0, low_open=True),
                        "leaf_clip": Interval(float, 0, low_open=True, allow_none=True),
                        "seeded": Flag()})


class NoPrivacy:
    """No noise, no accounting."""

    accountant = None

    def rows_of_tree(self, t: int, n: int, rng_seed) -> np.ndarray | None:
        return None

    @contextlib.contextmanager
    def ensemble(self, e: int):
        yield

    @contextlib.contextmanager
    def tree(self, t: int):
        yield

    @contextlib.contextmanager
    def depth(self, d: int):
        yield

    @contextlib.contextmanager
    def node(self, node_id: int):
        yield

    def clip(self, g, h):
        return g, h

    def leaf(self, value):
        return value

    def vote(self, gains: np.ndarray, depth: int, n_candidates: int) -> int:
        """The best feature (ties, within the split search's tolerance: the lowest); -1 when none can split."""
        return best_index(gains)

    def histogram(self, rows: np.ndarray, depth: int, n_candidates: int, n_chosen: int) -> np.ndarray:
        return rows

    def totals(self, totals: np.ndarray, n_candidates: int) -> np.ndarray:
        return totals

    def report(self) -> str | None:
        return None

    def state(self):
        """What a checkpoint keeps between trees (None: nothing)."""
        return None

    def restore(self, state) -> None:
        pass

    def resume_refusal(self) -> str | None:
        """Why a run with this privacy cannot resume from a checkpoint, or None."""
        return None


class DifferentialPrivacy(NoPrivacy):
    def __init__(self, options: DPOptions, n_rounds: int, max_depth: int, seed, trees_per_round: int = 1):
        """``n_rounds`` boosting rounds of ``trees_per_round`` trees each (a multiclass model's classes), every
        tree at most ``max_depth`` deep."""
        self.o = options
        self.tpe = options.trees_per_ensemble or n_rounds  # (rounds)
        self.n_ensembles = options.n_ensembles or -(-n_rounds // self.tpe)
        self.max_depth = max_depth
        self.accountant = PrivacyAccountant(options.epsilon)
        self.eps_depth = options.epsilon / self.n_ensembles / trees_per_round / max_depth
        self.rng = np.random.default_rng(seed) if options.seeded else None  # seed: an int or a list of ints
        self.g_star = float(options.g_clip)

    def rows_of_tree(self, t: int, n: int, rng_seed) -> np.ndarray:
        """Round ``t``'s part of the party's ``n`` instances (every tree of the round grows on it): the
        ensemble's rounds use disjoint parts."""
        order = np.random.default_rng(rng_seed).permutation(n)
        return np.sort(np.array_split(order, self.tpe)[t % self.tpe])

    @contextlib.contextmanager
    def ensemble(self, e: int):
        with self.accountant.parallel():
            yield

    @contextlib.contextmanager
    def tree(self, t: int):
        """One tree of round ``t``: the round's trees (one per class) share its branch, where they add up."""
        with self.accountant.branch(("tree", t)):
            yield

    @contextlib.contextmanager
    def depth(self, d: int):
        with self.accountant.parallel():
            yield

    @contextlib.contextmanager
    def node(self, node_id: int):
        with self.accountant.branch(("node", node_id)):
            yield

    def clip(self, g, h):
        return np.clip(g, -self.g_star, self.g_star), np.clip(h, 0.0, self.g_star)

    def leaf(self, value):
        """Leaf values from noisy sums, bounded (post-processing: no budget): a node whose noisy hessian sum
        is near zero would otherwise get a huge value that one tree cannot recover from."""
        c = self.o.leaf_clip
        return value if c is None else np.clip(value, -c, c)

    def _eps(self, depth: int, n_candidates: int) -> float:
        return self.eps_depth / (1 + 2 * n_candidates + (1 if depth == 0 else 0))

    def vote(self, gains, depth, n_candidates):
        valid = np.nonzero(gains > -np.inf)[0]
        if not len(valid):
            return -1
        k = exponential(gains[valid], 3.0 * self.g_star ** 2, self._eps(depth, n_candidates), self.accountant,
                        f"vote at depth {depth}", self.rng)
        return int(valid[k])

    def histogram(self, rows, depth, n_candidates, n_chosen):
        """Noisy (g, h) and counts of one candidate feature; the node's budget left after its vote (and the
        root's totals) is shared by the ``n_chosen`` candidates it actually has."""
        spent = self._eps(depth, n_candidates) * (2 if depth == 0 else 1)
        eps = (self.eps_depth - spent) / (2 * n_chosen)
        out = np.array(rows, dtype=np.float64)
        out[:, :2] = laplace(out[:, :2], 2.0 * self.g_star, eps, self.accountant, "gradient histogram",
                             self.rng)
        out[:, 2] = laplace(out[:, 2], 1.0, eps, self.accountant, "count histogram", self.rng)
        return out

    def totals(self, totals, n_candidates):
        return laplace(totals, 2.0 * self.g_star + 1.0, self._eps(0, n_candidates), self.accountant, "root totals",
                       self.rng)

    def report(self) -> str:
        return self.accountant.report()

    def state(self) -> dict:
        return {"accountant": self.accountant.state(),
                "rng": self.rng.bit_generator.state if self.rng is not None else None}

    def restore(self, state: dict) -> None:
        """Budget spent and noise stream as after the checkpointed tree.  The tree being grown when the run
        stopped is grown again from the same noise stream: its answers are the ones already released."""
        self.accountant.restore(state["accountant"])
        if self.rng is not None:
            self.rng.bit_generator.state = state["rng"]

    def resume_refusal(self) -> str | None:
        if self.rng is None:
            return ("FV-tree with differential privacy and OpenDP's exact samplers (seeded = false) cannot resume: "
                    "the unfinished tree's noisy answers cannot be drawn again, and fresh ones would spend budget "
                    "the accountant never counted; start again with a new output directory")
        return None
