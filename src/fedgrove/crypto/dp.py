"""Differential-privacy primitives: Laplace and exponential mechanisms, and an accountant.

By default the mechanisms are OpenDP's (``make_laplace``, ``make_noisy_max``),
which sample noise exactly and are safe against floating-point attacks; their
randomness comes from the operating system and cannot be seeded.  Passing a
``seed`` switches to a numpy sampler so experiments are reproducible: that path
is **not** safe against floating-point attacks and is meant for research runs
only (the function says so in a warning once per process).

The :class:`PrivacyAccountant` adds up what is spent under sequential
composition, takes the maximum within a :meth:`PrivacyAccountant.parallel`
block (disjoint data), and refuses with :class:`~fedgrove.exceptions.PrivacyBudgetError`
any spend that would exceed the configured epsilon.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np

from fedgrove.exceptions import InvalidParameterError, PrivacyBudgetError

_SLACK = 1e-9


class PrivacyAccountant:
    """Adds up epsilon under sequential composition, takes maxima under parallel composition.

    ``with acc.parallel():`` opens a block of queries on disjoint data: each
    ``with acc.branch(key):`` inside it is one part of the data, whose queries
    add up; the block costs the largest branch.  A ``spend`` directly inside a
    block is a branch of its own.  Blocks nest (a tree's depths inside an
    ensemble's trees), and every spend is checked against the budget as if
    all open blocks closed now.
    """

    def __init__(self, epsilon: float):
        if not (isinstance(epsilon, (int, float)) and epsilon > 0 and math.isfinite(epsilon)):
            raise InvalidParameterError(f"privacy budget epsilon must be a positive finite number, got {epsilon!r}")
        self.budget = float(epsilon)
        self.log: list[tuple[str, float]] = []     # this process's mechanism calls (what, epsilon)
        self._earlier_calls = 0                    # calls before a restored state (:meth:`restore`)
        self._stack: list[dict] = [{"kind": "seq", "spent": 0.0}]

    @property
    def calls(self) -> int:
        """Mechanism calls accounted for, those before a restored state included."""
        return self._earlier_calls + len(self.log)

    def state(self) -> dict:
        """What was spent so far, as JSON-ready data (for checkpoints); only between branches of a block."""
        frames = []
        for f in self._stack:
            if f["kind"] == "seq":
                frames.append({"kind": "seq", "spent": f["spent"]})
            else:
                if f["open"] is not None:
                    raise InvalidParameterError("the accountant's state is taken between branches, not inside one")
                frames.append({"kind": "par", "branches": [[list(k), v] for k, v in f["branches"].items()]})
        return {"budget": self.budget, "calls": self.calls, "stack": frames}

    def restore(self, state: dict) -> None:
        """Continue from :meth:`state`'s result; the open blocks must be the ones it was taken in (as many)."""
        try:
            frames = [{"kind": "seq", "spent": float(f["spent"])} if f["kind"] == "seq" else
                      {"kind": "par", "open": None, "branches": {tuple(k): float(v) for k, v in f["branches"]}}
                      for f in state["stack"]]
            budget, calls = float(state["budget"]), int(state["calls"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidParameterError(f"not a privacy accountant state: {type(exc).__name__}: {exc}") from None
        if budget != self.budget:
            raise InvalidParameterError(f"the saved privacy state has budget {budget:g}, this run {self.budget:g}")
        if len(frames) != len(self._stack) or [f["kind"] for f in frames] != [f["kind"] for f in self._stack]:
            raise InvalidParameterError("the saved privacy state was taken in other composition blocks than are "
                                        "open now")
        self._stack[:] = frames
        self.log, self._earlier_calls = [], calls

    @property
    def spent(self) -> float:
        return self._projected()

    @property
    def remaining(self) -> float:
        return self.budget - self.spent

    def _projected(self) -> float:
        """Total cost if every open block closed now."""
        value = 0.0
        for frame in reversed(self._stack):
            if frame["kind"] == "seq":
                value += frame["spent"]
            else:
                branches = dict(frame["branches"])
                if frame["open"] is not None:
                    branches[frame["open"]] = branches.get(frame["open"], 0.0) + value
                value = max(branches.values(), default=0.0)
        return value

    def spend(self, epsilon: float, what: str = "") -> None:
        if not epsilon > 0:
            raise InvalidParameterError(f"epsilon to spend must be positive, got {epsilon!r}")
        top = self._stack[-1]
        if top["kind"] == "par":  # a query straight inside a parallel block is a branch of its own
            key = ("spend", len(top["branches"]))
            top["branches"][key] = float(epsilon)
            undo = lambda: top["branches"].pop(key)  # noqa: E731
        else:
            top["spent"] += float(epsilon)
            undo = lambda: top.__setitem__("spent", top["spent"] - float(epsilon))  # noqa: E731
        projected = self._projected()
        if projected > self.budget * (1 + _SLACK):
            undo()
            raise PrivacyBudgetError(f"spending epsilon {epsilon:g} on {what or 'a query'} would bring the total to "
                                     f"{projected:g}, over the budget of {self.budget:g}; stopping")
        self.log.append((what, epsilon))

    @contextlib.contextmanager
    def parallel(self):
        """Queries on disjoint data inside this block cost their maximum, not their sum."""
        self._stack.append({"kind": "par", "branches": {}, "open": None})
        try:
            yield self
        finally:
            frame = self._stack.pop()
            self._add_to_top(max(frame["branches"].values(), default=0.0))

    @contextlib.contextmanager
    def branch(self, key):
        """One disjoint part of the data inside :meth:`parallel`; its queries add up."""
        par = self._stack[-1]
        if par["kind"] != "par" or par["open"] is not None:
            raise InvalidParameterError("branch() belongs directly inside parallel()")
        par["open"] = key
        self._stack.append({"kind": "seq", "spent": 0.0})
        try:
            yield self
        finally:
            frame = self._stack.pop()
            par["open"] = None
            par["branches"][key] = par["branches"].get(key, 0.0) + frame["spent"]

    def _add_to_top(self, cost: float) -> None:
        top = self._stack[-1]
        if top["kind"] == "seq":
            top["spent"] += cost
        else:
            top["branches"][("block", len(top["branches"]))] = cost

    def report(self) -> str:
        return f"epsilon spent {self.spent:.6g} of {self.budget:.6g} ({self.calls} mechanism calls)"


_warned = False


def _seeded_warning():
    global _warned
    if not _warned:
        warnings.warn("seeded DP noise (numpy) is not safe against floating-point attacks; OpenDP's exact "
                      "samplers are ([fvtree.dp] seeded = false, or no rng)", RuntimeWarning, stacklevel=3)
        _warned = True


def laplace(values, sensitivity: float, epsilon: float, accountant: PrivacyAccountant | None = None,
            what: str = "", rng: np.random.Generator | None = None) -> np.ndarray:
    """``values`` plus Laplace noise of scale sensitivity/epsilon (L1 sensitivity of the whole vector)."""
    if not (sensitivity > 0 and epsilon > 0):
        raise InvalidParameterError("sensitivity and epsilon must be positive")
    if accountant is not None:
        accountant.spend(epsilon, what or "laplace")
    x = np.atleast_1d(np.asarray(values, dtype=np.float64))
    scale = sensitivity / epsilon
    if rng is not None:
        _seeded_warning()
        return x + rng.laplace(0.0, scale, size=x.shape)
    import opendp.prelude as dp

    dp.enable_features("contrib")
    meas = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float),
                             scale=scale)
    return np.asarray(meas(x.ravel().tolist()), dtype=np.float64).reshape(x.shape)


def exponential(scores, sensitivity: float, epsilon: float, accountant: PrivacyAccountant | None = None,
                what: str = "", rng: np.random.Generator | None = None) -> int:
    """Index chosen by the exponential mechanism (report-noisy-max with Gumbel noise) on ``scores``."""
    if not (sensitivity > 0 and epsilon > 0):
        raise InvalidParameterError("sensitivity and epsilon must be positive")
    scores = np.asarray(scores, dtype=np.float64)
    if accountant is not None:
        accountant.spend(epsilon, what or "exponential")
    scale = 2.0 * sensitivity / epsilon
    if rng is not None:
        _seeded_warning()
        return int(np.argmax(scores + rng.gumbel(0.0, scale, size=scores.shape)))
    import opendp.prelude as dp

    dp.enable_features("contrib")
    meas = dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T=float, nan=False)),
                               dp.linf_distance(T=float, monotonic=False), dp.max_divergence(), scale=scale)
    if meas.map(sensitivity) > epsilon * (1 + _SLACK):
        raise PrivacyBudgetError("OpenDP's privacy map exceeds the requested epsilon")  # pragma: no cover
    return int(meas(scores.tolist()))
