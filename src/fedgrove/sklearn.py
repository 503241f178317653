"""scikit-learn estimators over the centralised engine: the thin third layer.

:class:`GBDTClassifier`, :class:`GBDTRegressor`, :class:`RandomForestClassifier` and
:class:`RandomForestRegressor` wrap :func:`~fedgrove.engine.gbdt.train_gbdt` and
:func:`~fedgrove.engine.forest.train_forest` for pipelines, grid searches and cross-validation.
They train on one machine's data (ALL-IN or SOLO); a federation's model comes from its protocol.

The parameters are those of :class:`~fedgrove.engine.gbdt.GBDTParams` and
:class:`~fedgrove.engine.forest.ForestParams` (the objective or task and the number of classes
follow from the estimator and the labels) and are checked when ``fit`` builds them.  The
classifiers take any labels scikit-learn's classifiers take (``classes_`` maps them to the
engine's 0..K-1) and ``class_weight``; every ``fit`` takes ``sample_weight``.  NaN marks a missing
value; sparse input is made dense; columns of text or categories are refused, each named (encode them
first, e.g. with scikit-learn's ``OrdinalEncoder``).  The fitted
fedgrove model is ``model_``: ``est.model_.save(path)`` writes the file that
``fedgrove predict`` reads, with the class names.

Example::

    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import cross_val_score
    from fedgrove.sklearn import GBDTClassifier

    X, y = load_breast_cancer(return_X_y=True)
    print(cross_val_score(GBDTClassifier(n_estimators=50), X, y, cv=5).mean())
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.class_weight import compute_sample_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from fedgrove.engine.forest import ForestParams, train_forest
from fedgrove.engine.gbdt import GBDTParams, check_eval_pair, check_sample_weight, train_gbdt
from fedgrove.engine.model import non_number_columns
from fedgrove.exceptions import DataError, InvalidParameterError

__all__ = ["GBDTClassifier", "GBDTRegressor", "RandomForestClassifier", "RandomForestRegressor"]


#: how every estimator checks its input (sparse input is kept: the engine makes it dense)
_INPUT = dict(accept_sparse=("csr", "csc", "coo"), dtype=np.float64, ensure_all_finite="allow-nan")


class _Ensemble(BaseEstimator):
    """What the four estimators share: input checks, the engine call, predictions and importances."""

    #: GBDTParams or ForestParams: the engine parameters are the estimator's of the same names
    _params_class = None

    def _check_X(self, X, reset: bool):
        return self._validated(X, reset=reset)

    def _validated(self, X, *y, **kw):
        """scikit-learn's checks of ``X`` (and ``y``); a feature matrix holding text is refused naming its columns
        and how to encode them (scikit-learn's own message names only the first value)."""
        try:
            return validate_data(self, X, *y, **kw, **_INPUT)
        except ValueError as exc:
            text = non_number_columns(X)
            if not text:
                raise
            shown = ", ".join(repr(c) for c in text[:5]) + (f" and {len(text) - 5} more" if len(text) > 5 else "")
            shown += " (counted from 0)" if isinstance(text[0], int) else ""
            raise ValueError(f"{type(self).__name__} takes numbers (NaN for missing values), but column"
                             f"{'s' if len(text) > 1 else ''} {shown} of X hold{'' if len(text) > 1 else 's'} "
                             f"text or categories ({exc}); encode them first, e.g. with scikit-learn's "
                             f"OrdinalEncoder in a ColumnTransformer, or fedgrove.data.io.table_from_frame(df, "
                             f"categorical='auto')") from exc

    def _engine_params(self, **fixed):
        names = [k for k in self._get_param_names() if k != "class_weight"]  # (the classifiers' own)
        return self._params_class(**{k: getattr(self, k) for k in names}, **fixed)

    def _fit_model(self, X, y, params, sample_weight=None, eval_set=None, eval_sample_weight=None):
        names = getattr(self, "feature_names_in_", None)  # (set by validate_data for a DataFrame)
        if isinstance(params, GBDTParams):
            return train_gbdt(params, X, y, eval_set=eval_set, feature_names=names, sample_weight=sample_weight,
                              eval_sample_weight=eval_sample_weight)
        return train_forest(params, X, y, feature_names=names, sample_weight=sample_weight)

    def _validate_xy(self, X, y, y_numeric: bool):
        return self._validated(X, y, y_numeric=y_numeric)

    @property
    def feature_importances_(self) -> np.ndarray:
        """Each feature's share of the summed split gains (boosting: loss reduction; forest: impurity decrease
        weighted by the node's share of the samples); zeros when no tree splits."""
        check_is_fitted(self)
        gain = self.model_.feature_importance("gain")
        total = gain.sum()
        return gain / total if total > 0 else gain

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        tags.input_tags.sparse = True
        return tags


class _Classifier(ClassifierMixin, _Ensemble):
    def _class_weighted(self, y, sample_weight):
        """``sample_weight`` times the weight ``class_weight`` gives each row's class ("balanced": n_samples /
        (n_classes * the class's rows), as scikit-learn's classifiers weigh them; a dict: {class: weight},
        classes it leaves out weighing 1)."""
        if self.class_weight is None:
            return sample_weight
        if not (self.class_weight == "balanced" or isinstance(self.class_weight, dict)):
            raise InvalidParameterError(f"class_weight must be 'balanced', a dict {{class: weight}} or None, got "
                                        f"{self.class_weight!r}")
        if isinstance(self.class_weight, dict):
            held = np.unique(y).tolist()
            unknown = [k for k in self.class_weight if k not in held]
            if unknown:
                raise InvalidParameterError(f"class_weight names classes that y does not hold: {unknown[:10]}; "
                                            f"the classes are {held[:10]}")
            bad = {k: w for k, w in self.class_weight.items()
                   if not (isinstance(w, (int, float, np.number)) and 0 <= w < np.inf)}
            if bad:
                raise InvalidParameterError(f"class_weight's weights must be non-negative numbers, got {bad}")
        weights = compute_sample_weight(self.class_weight, y)
        if sample_weight is None:
            return weights
        return weights * check_sample_weight(sample_weight, len(y))

    def _encode_labels(self, y) -> np.ndarray:
        check_classification_targets(y)
        self.classes_, encoded = np.unique(y, return_inverse=True)
        self.n_classes_ = len(self.classes_)
        if self.n_classes_ < 2:
            raise DataError(f"{type(self).__name__} needs at least 2 classes in y, got 1 class: "
                            f"{self.classes_.tolist()[0]!r}")
        return encoded

    def _encode_eval(self, eval_set):
        """``eval_set``'s labels by ``classes_``; every one of them must be a class of the training labels."""
        if eval_set is None:
            return None
        check_eval_pair(eval_set)
        X_val = self._check_X(eval_set[0], reset=False)
        y_val = np.asarray(eval_set[1]).reshape(-1)
        known = np.isin(y_val, self.classes_)
        if not known.all():
            unseen = np.unique(y_val[~known])[:10].tolist()
            raise DataError(f"eval_set's labels hold classes the training labels lack: {unseen}; the classes are "
                            f"{self.classes_.tolist()[:10]}")
        return X_val, np.searchsorted(self.classes_, y_val)

    def _keep(self, model):
        model.classes = self.classes_.tolist()  # (the saved model names the classes, as the CLI's do)
        self.model_ = model
        return self

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities, shape (n_samples, n_classes), columns in the order of ``classes_``."""
        check_is_fitted(self)
        return self.model_.predict_proba(self._check_X(X, reset=False))

    def predict(self, X) -> np.ndarray:
        """The most probable class of each row (a label of ``classes_``)."""
        proba = self.predict_proba(X)  # (first: it checks that the estimator is fitted)
        return self.classes_[np.argmax(proba, axis=1)]


class _Regressor(RegressorMixin, _Ensemble):
    def predict(self, X) -> np.ndarray:
        check_is_fitted(self)
        return self.model_.predict(self._check_X(X, reset=False))


_GBDT_DOC = """

    Parameters are :class:`~fedgrove.engine.gbdt.GBDTParams`'s: the gain has the papers' 1/2, so
    XGBoost's ``gamma`` g is ``g/2`` here.  ``fit(X, y, eval_set=(X_val, y_val))`` evaluates every round
    on a validation set, which ``early_stopping_rounds`` needs (``eval_sample_weight``: its rows' weights in
    the metric; ``class_weight`` does not weigh them).  ``fit(X, y, sample_weight=w)`` weights the
    rows' gradients and hessians: a whole-number weight k trains as k copies of the row would, 0 as its
    removal (``min_child_weight`` bounds the weighted hessians; ``min_samples_leaf`` counts rows).
    Fitted: ``model_`` (a :class:`~fedgrove.engine.model.GBDTModel`), ``best_iteration_`` (with early
    stopping, else None), ``n_features_in_``, ``feature_names_in_`` (a DataFrame's columns),
    ``feature_importances_``.
    """


_CLASS_WEIGHT_DOC = """
    ``class_weight``: ``"balanced"`` (each class weighs n_samples / (n_classes x its rows), as in
    scikit-learn) or ``{class: weight}`` (classes left out weigh 1) multiplies every row's
    ``sample_weight`` by its class's weight.
    """


class _GBDT:
    _params_class = GBDTParams

    def __init__(self, *, n_estimators=100, learning_rate=0.1, max_depth=6, reg_lambda=1.0, gamma=0.0,
                 min_child_weight=1e-3, min_samples_leaf=1, max_bins=255, subsample=1.0, colsample_bytree=1.0,
                 early_stopping_rounds=None, eval_metric=None, seed=0, n_threads=None):
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.reg_lambda = reg_lambda
        self.gamma = gamma
        self.min_child_weight = min_child_weight
        self.min_samples_leaf = min_samples_leaf
        self.max_bins = max_bins
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.early_stopping_rounds = early_stopping_rounds
        self.eval_metric = eval_metric
        self.seed = seed
        self.n_threads = n_threads


class GBDTClassifier(_GBDT, _Classifier):
    __doc__ = "Gradient-boosted trees for classification: logistic loss for two classes, softmax for more." \
              + _GBDT_DOC + _CLASS_WEIGHT_DOC

    def __init__(self, *, n_estimators=100, learning_rate=0.1, max_depth=6, reg_lambda=1.0, gamma=0.0,
                 min_child_weight=1e-3, min_samples_leaf=1, max_bins=255, subsample=1.0, colsample_bytree=1.0,
                 early_stopping_rounds=None, eval_metric=None, seed=0, n_threads=None, class_weight=None):
        super().__init__(n_estimators=n_estimators, learning_rate=learning_rate, max_depth=max_depth,
                         reg_lambda=reg_lambda, gamma=gamma, min_child_weight=min_child_weight,
                         min_samples_leaf=min_samples_leaf, max_bins=max_bins, subsample=subsample,
                         colsample_bytree=colsample_bytree, early_stopping_rounds=early_stopping_rounds,
                         eval_metric=eval_metric, seed=seed, n_threads=n_threads)
        self.class_weight = class_weight

    def fit(self, X, y, sample_weight=None, *, eval_set=None, eval_sample_weight=None):
        X, labels = self._validate_xy(X, y, y_numeric=False)
        y = self._encode_labels(labels)
        sample_weight = self._class_weighted(labels, sample_weight)
        multi = self.n_classes_ > 2
        params = self._engine_params(objective="multiclass" if multi else "binary",
                                     n_classes=self.n_classes_ if multi else None)
        model = self._fit_model(X, y, params, sample_weight, self._encode_eval(eval_set), eval_sample_weight)
        self.best_iteration_ = model.best_iteration
        return self._keep(model)

    def decision_function(self, X) -> np.ndarray:
        """Raw scores (log-odds of ``classes_[1]``, shape (n_samples,), for two classes; one column per class
        before the softmax for more)."""
        check_is_fitted(self)
        return self.model_.predict_raw(self._check_X(X, reset=False))


class GBDTRegressor(_GBDT, _Regressor):
    __doc__ = "Gradient-boosted trees for regression (squared error)." + _GBDT_DOC

    def fit(self, X, y, sample_weight=None, *, eval_set=None, eval_sample_weight=None):
        X, y = self._validate_xy(X, y, y_numeric=True)
        if eval_set is not None:
            check_eval_pair(eval_set)
            eval_set = (self._check_X(eval_set[0], reset=False), eval_set[1])
        self.model_ = self._fit_model(X, y, self._engine_params(objective="regression"), sample_weight, eval_set,
                                      eval_sample_weight)
        self.best_iteration_ = self.model_.best_iteration
        return self


_FOREST_DOC = """

    Parameters are :class:`~fedgrove.engine.forest.ForestParams`'s (``feature_sampling="tree"`` draws
    the features once per tree, as Federated Forest does; ``max_features`` defaults to ``"sqrt"`` for
    regression too, where scikit-learn's regressor takes every feature).  ``fit(X, y, sample_weight=w)``
    leaves out the rows of weight 0 and multiplies the others' bootstrap draws by their weights, rescaled to
    average 1 (``min_samples_leaf`` and ``min_samples_split`` then count rows of average weight).  Fitted:
    ``model_`` (a :class:`~fedgrove.engine.model.ForestModel`), ``n_features_in_``, ``feature_names_in_``,
    ``feature_importances_``.
    """


class _Forest:
    _params_class = ForestParams

    def __init__(self, *, n_estimators=100, criterion=None, max_depth=None, min_samples_split=2,
                 min_samples_leaf=1, min_impurity_decrease=0.0, max_features="sqrt", feature_sampling="node",
                 bootstrap=True, max_bins=255, seed=0, n_threads=None):
        self.n_estimators = n_estimators
        self.criterion = criterion
        self.max_depth = max_depth
        self.min_samples_split = min_samples_split
        self.min_samples_leaf = min_samples_leaf
        self.min_impurity_decrease = min_impurity_decrease
        self.max_features = max_features
        self.feature_sampling = feature_sampling
        self.bootstrap = bootstrap
        self.max_bins = max_bins
        self.seed = seed
        self.n_threads = n_threads


class RandomForestClassifier(_Forest, _Classifier):
    __doc__ = "Random forest for classification (CART with gini or entropy)." + _FOREST_DOC + _CLASS_WEIGHT_DOC

    def __init__(self, *, n_estimators=100, criterion=None, max_depth=None, min_samples_split=2,
                 min_samples_leaf=1, min_impurity_decrease=0.0, max_features="sqrt", feature_sampling="node",
                 bootstrap=True, max_bins=255, seed=0, n_threads=None, class_weight=None):
        super().__init__(n_estimators=n_estimators, criterion=criterion, max_depth=max_depth,
                         min_samples_split=min_samples_split, min_samples_leaf=min_samples_leaf,
                         min_impurity_decrease=min_impurity_decrease, max_features=max_features,
                         feature_sampling=feature_sampling, bootstrap=bootstrap, max_bins=max_bins, seed=seed,
                         n_threads=n_threads)
        self.class_weight = class_weight

    def fit(self, X, y, sample_weight=None):
        X, labels = self._validate_xy(X, y, y_numeric=False)
        y = self._encode_labels(labels)
        sample_weight = self._class_weighted(labels, sample_weight)
        return self._keep(self._fit_model(X, y, self._engine_params(task="classification"), sample_weight))


class RandomForestRegressor(_Forest, _Regressor):
    __doc__ = "Random forest for regression (CART with squared error)." + _FOREST_DOC

    def fit(self, X, y, sample_weight=None):
        X, y = self._validate_xy(X, y, y_numeric=True)
        self.model_ = self._fit_model(X, y, self._engine_params(task="regression"), sample_weight)
        return self
