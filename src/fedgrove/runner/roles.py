"""What each role of each protocol runs, for ``fedgrove simulate`` and ``fedgrove party`` alike.

:data:`TRAIN` maps (protocol, role) to a function that trains on a
:class:`RoleContext` and writes the party's model file (``<party>.model.json``);
:data:`PREDICT` to one that predicts the configured test set from those files
alone (the lead party writes ``<party>.predictions.csv``).  A function gets
only its own party's data and files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# protocols are imported here, not in the role functions: parties run in threads of one process, and
# concurrent first imports of one package's modules can deadlock
from fedgrove import jsontext, metrics
from fedgrove.crypto.he import keygen
from fedgrove.data.io import (LIBSVM_BASE, check_categories, detect_format, feature_columns, label_text, libsvm_layout,
                              load_table, take_weights)
from fedgrove.engine.model import GBDTModel, atomic_write_text, load_model
from fedgrove.exceptions import DataError, ModelFormatError, listing
from fedgrove.log import logger
from fedgrove.protocols.forest.client import ForestClient, answer_predictions
from fedgrove.protocols.forest.master import ForestMaster
from fedgrove.protocols.fvtree.party import FVTreeParty
from fedgrove.protocols.horizontal.aggregator import HorizontalAggregator
from fedgrove.protocols.horizontal.client import HorizontalClient
from fedgrove.protocols.psi import common_rows
from fedgrove.protocols.hybridtree.guest import HybridGuest
from fedgrove.protocols.hybridtree.host import HybridHost, HybridHostModel, predict_hybrid
from fedgrove.protocols.simfl.party import SimFLParty
from fedgrove.protocols.vertical.active import VerticalActive, predict_active
from fedgrove.protocols.vertical.messages import ids_digest
from fedgrove.protocols.vertical.passive import PassiveModel, VerticalPassive, answer_predict
from fedgrove.runner.config import FederationConfig, PartySpec, classes_setting, label_setting


@dataclass
class RoleContext:
    cfg: FederationConfig
    spec: PartySpec
    channel: object
    he: object = None
    resume: bool = False
    progress: object = None
    checkpoint: object = None

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    @property
    def model_path(self) -> Path:
        return self.out_dir / f"{self.spec.name}.model.json"

    def others(self, role: str) -> list[str]:
        """Names of the parties with ``role``, in config order (this party excluded)."""
        return [p.name for p in self.cfg.parties if p.role == role and p.name != self.spec.name]

    def data(self, with_label: bool, test: bool = False, model_names=None):
        """This party's training (or test) table, rows sorted by instance ID when it has IDs.  A test table's
        columns are matched by name to ``model_names`` (the features a loaded model was trained on), or else to
        the training file's."""
        path = self.spec.test if test else self.spec.data
        if path is None:
            raise DataError(f"party {self.spec.name}: no test data configured (test = ...)")
        # a test file may lack the label column: it is then only predicted, not scored
        label = self.spec.label if (with_label or test) else None
        width, base = self.spec.n_features, self.spec.libsvm_base
        if test and detect_format(path) == "libsvm" and detect_format(self.spec.data) == "libsvm" and \
                (width is None or base is None):  # a LIBSVM test file is read as the training file: as wide, and
            found = libsvm_layout(self.spec.data)  # numbered from the same index (else its features could shift)
            width, base = width or found[0], found[1] if base is None else base
        # a HybridTree guest may hold none of the test instances: its part is then a file of column names only
        table = load_table(path, label=label, label_required=not test, categorical=self._categories(test),
                           n_features=width, libsvm_base=base, allow_empty=test and self.spec.role == "guest")
        if self.spec.weight is not None and (not test or self.spec.weight in table.feature_names):
            # the column of row weights, no feature; a test file's, if it holds it, weighs the test scores
            table = take_weights(table, self.spec.weight, repr(str(path)), f"party {self.spec.name}: weight")
        if table.left_out:  # a LIBSVM file with values beyond the width
            shown = listing(table.left_out)
            if not test:
                raise DataError(f"party {self.spec.name}: {str(path)!r} has values in features beyond n_features = "
                                f"{width}: {shown}; raise n_features, the same at every party")
            logger.info("party %s: features of %s beyond the %d of its training data, left out: %s",
                        self.spec.name, path, width, shown)
        if table.categories and not test:  # kept for prediction, which must encode with the same categories
            atomic_write_text(self.categories_path, json.dumps(table.categories))
            if not isinstance(self.spec.categorical, dict):  # found in the data: parties may disagree
                found = ", ".join(f"{_toml_key(c)} = {json.dumps(v[:50])}" + (f" (the first 50 of {len(v)})"
                                                                              if len(v) > 50 else "")
                                  for c, v in table.categories.items())
                logger.info("party %s: categories found in %s: categorical = {%s}", self.spec.name, path, found)
        if table.unseen:
            logger.info("party %s: values of %s not seen in training, taken as missing: %s", self.spec.name, path,
                        table.unseen)
        if test and (model_names is not None or self.spec.data is not None):
            # the test file's columns matched by name to the model's features: the training file may have changed
            names = model_names if model_names is not None else feature_columns(self.spec.data, self.spec.label,
                                                                                weight=self.spec.weight)
            X, left_out = table.features_as(names, repr(str(path)))
            if names is not None and X is not table.X:
                table.X, table.feature_names = X, list(names)
                if left_out:
                    logger.info("party %s: columns of %s not in its training data, left out: %s", self.spec.name,
                                path, ", ".join(left_out[:10]))
        if with_label and not test and table.y is None:
            raise DataError(f"party {self.spec.name}: {path} has no label column; set label = ... in its config")
        if table.y is not None:
            table.y = self._label_codes(table.y, path)
        if table.ids is not None:  # align by instance ID: every party sorts its rows the same way
            table = table.subset(np.argsort(table.ids, kind="stable"))
        return table

    def common(self, table, lead: str, others: list[str], test: bool = False, everyone: bool = True):
        """With ``[federation] align = "psi"``, the table's rows whose instance ID every party with data holds,
        found by private set intersection around ``lead`` (``others``: the other parties with data, for the
        lead); else the table as it is."""
        if self.cfg.align != "psi":
            return table
        path = self.spec.test if test else self.spec.data
        if table.ids is None:
            raise DataError(f"party {self.spec.name}: federation.align = \"psi\" intersects the parties' instance "
                            f"IDs: {path} needs an _id column")
        rows = common_rows(self.channel, table.ids, lead, others, everyone)
        if len(rows) == table.n_samples:  # every row kept (always so for HybridTree's host)
            return table
        logger.info("party %s: %d of the %d rows of %s are held by %s; the others are left out",
                    self.spec.name, len(rows), table.n_samples, path, "every party" if everyone else lead)
        return table.subset(rows)

    def _label_codes(self, y: np.ndarray, path) -> np.ndarray:
        """Labels as numbers: a label becomes its class's position in ``federation.classes`` (which every party
        lists alike, so codes mean the same everywhere), by name for text labels and by value for numeric ones;
        numeric labels without ``classes`` pass through, and must then be class codes for classification."""
        y = np.asarray(y)
        where = f"party {self.spec.name}: label column {self.spec.label!r} of {str(path)!r}"
        classes = self.cfg.classes
        numeric = y.dtype.kind in "fiub"
        if classes is None:
            if not numeric:
                raise DataError(f"{where} holds text; list the classes in the order of their codes 0, 1, ... in "
                                f"the federation's config, the same in every party's: {classes_setting(y, 10)}")
            self._check_codes(y, where)
            return y
        if numeric != (not isinstance(classes[0], str)):
            raise DataError(f"{where} holds {'numbers' if numeric else 'text'}, but federation.classes lists "
                            f"{'class names' if numeric else 'numbers'} {classes}; list the labels as the file "
                            f"holds them: {classes_setting(y, 10)}")
        values, inverse = np.unique(y.astype(np.float64) if numeric else np.array([str(v) for v in y.tolist()]),
                                    return_inverse=True)
        code = {(float(c) if numeric else c): k for k, c in enumerate(classes)}
        outside = [k for k, v in enumerate(values.tolist()) if v not in code]
        if outside:
            row = int(np.argmax(np.isin(inverse, outside)))
            label = label_text(y[row]) if numeric else repr(str(y[row]))
            raise DataError(f"{where} holds {label} (data row {row + 1}), which is not in "
                            f"federation.classes {classes}")
        return np.array([code[v] for v in values.tolist()], dtype=np.float64)[inverse]

    def _check_codes(self, y: np.ndarray, where: str) -> None:
        """Numeric labels without ``classes``: a classification model takes the codes 0, 1, ... (binary: 0 and
        1); other labels (LIBSVM's -1 and 1) must be listed as classes."""
        params = self.cfg.params
        key, objective = label_setting(self.cfg.protocol, params)
        if objective == "regression":
            return
        values = np.unique(y.astype(np.float64))
        top = 1 if objective == "binary" else (params.get("n_classes") or np.inf) - 1
        if np.all((values >= 0) & (values <= top) & (values == np.round(values))):
            return
        shown = listing(values, show=label_text)
        raise DataError(f"{where} holds the labels {shown}, but a {objective} model takes its classes as the codes "
                        f"0{', 1' if objective == 'binary' else ', 1, ...'}; list the labels in the order of their "
                        f"codes in the federation's config, the same in every party's: {classes_setting(y, 10)} "
                        f"(or, for numeric targets, set [params] {key} = \"regression\")")

    def class_names(self, n_classes: int) -> list:
        """The classes a model's outputs stand for: ``federation.classes`` when given, else 0..K-1."""
        return list(self.cfg.classes) if self.cfg.classes is not None else list(range(n_classes))

    @property
    def categories_path(self) -> Path:
        return self.out_dir / f"{self.spec.name}.categories.json"

    def _categories(self, test: bool):
        """What load_table takes as ``categorical``: the config's for training data; for test data the
        categories training found (a table in the config is used as it is)."""
        spec = self.spec.categorical
        if not test or spec is None or isinstance(spec, dict):
            return spec
        if not self.categories_path.exists():
            raise ModelFormatError(f"party {self.spec.name}: no {self.categories_path} with the categories found "
                                   f"in training; train first")
        try:
            found = json.loads(self.categories_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ModelFormatError(f"{self.categories_path} is not valid JSON: {exc}") from None
        try:
            check_categories(found)
        except DataError as exc:
            raise ModelFormatError(f"{self.categories_path} is damaged: {exc}") from None
        return found

    def key_pair(self):
        """The run's key pair: generated once (a 2048-bit key takes a second or more, longer on a busy machine),
        before the first message where :func:`~fedgrove.runner.run.run_role` can."""
        if self.he is None:
            he = self.cfg.he
            self.he = keygen(he["scheme"], he["key_bits"], he.get("backend"))
        return self.he

    @property
    def holds_key(self) -> bool:
        """Whether this party generates the run's key pair."""
        if (self.cfg.protocol, self.spec.role) in (("vertical", "active"), ("hybridtree", "host")):
            return True
        return (self.cfg.protocol, self.spec.role) == ("federated-forest", "client") and \
            self.spec.label is not None and self.cfg.forest["label_mode"] == "encrypted"

    def save_json(self, d: dict) -> None:
        atomic_write_text(self.model_path, jsontext.dumps(d))  # (trees' texts as their dicts cached them)

    def _check_model_file(self) -> None:
        if not self.model_path.exists():
            raise ModelFormatError(f"party {self.spec.name}: no model file {self.model_path}; train first (the same "
                                   f"command without --predict)")

    def load_model(self):
        """This party's whole model (the protocols whose parties each hold one), from its file."""
        self._check_model_file()
        return load_model(self.model_path)

    def load_json(self) -> dict:
        self._check_model_file()
        try:
            return json.loads(self.model_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ModelFormatError(f"{self.model_path} is not valid JSON: {exc}") from None

    def load_part(self, parse):
        """This party's part of a federated model, read from its file by ``parse`` (a ``from_dict``); what is
        wrong with it is said with the file's name."""
        d = self.load_json()
        try:
            return parse(d)
        except ModelFormatError as exc:
            raise ModelFormatError(f"{self.model_path} is corrupt: {exc}") from None


def _toml_key(name: str) -> str:
    """A column name as a TOML key: bare when it can be, else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def names(table) -> list[str] | None:
    """The table's feature names when its file has them."""
    return list(table.feature_names) if table.named else None


def keep_names(model, table) -> None:
    """A whole-model party's model keeps its feature names, categories and label column, for ``fedgrove
    predict`` (which scores a file holding that column, and would otherwise take it for a feature)."""
    model.feature_names = names(table)
    if table.categories:
        model.metadata["categories"] = table.categories
    if table.label_name is not None and table.named:
        model.metadata["label"] = table.label_name
    if LIBSVM_BASE in table.meta:  # fedgrove predict reads a LIBSVM file numbered as the training data was
        model.metadata[LIBSVM_BASE] = table.meta[LIBSVM_BASE]


def schema(table) -> list[str] | None:
    """What horizontal parties check to be the same everywhere: the feature names in order, then each
    categorical column with its categories (their codes must mean the same everywhere); for a LIBSVM file, the
    index it numbers its first feature with (files numbered from 0 and from 1 would shift features by one)."""
    if LIBSVM_BASE in table.meta:  # positions, not names: the files must number the features alike
        return [f"\x1eLIBSVM features numbered from {table.meta[LIBSVM_BASE]}"]
    if not table.named:
        return None
    return list(table.feature_names) + [f"{c}\x1e" + "\x1f".join(v) for c, v in sorted(table.categories.items())]


# ------------------------------------------------------------------------------ vertical
def _vertical_active(ctx: RoleContext) -> dict:
    params = ctx.cfg.make_params()
    table = ctx.common(ctx.data(with_label=True), ctx.cfg.lead, ctx.others("passive"))
    role = VerticalActive(ctx.channel, table.X, table.y, ctx.others("passive"), params, ctx.key_pair(),
                          ids=table.ids, rows_per_ciphertext=ctx.cfg.he.get("rows_per_ciphertext"),
                          sample_weight=table.weights)
    model = role.fit(ctx.checkpoint, ctx.resume, ctx.progress)
    model.metadata.update({"protocol": "vertical", "party": ctx.spec.name,
                           "ids_digest": ids_digest(table.ids).hex() or None,
                           "own_feature_names": names(table)})  # its own columns' names, for reports
    if ctx.spec.weight is not None:
        model.metadata["weight"] = ctx.spec.weight
    if params.objective != "regression":
        model.classes = ctx.class_names(model.n_classes)
    model.save(ctx.model_path)
    return {"trees": model.n_trees}


def _vertical_passive(ctx: RoleContext) -> dict:
    params = ctx.cfg.make_params()
    table = ctx.common(ctx.data(with_label=False), ctx.cfg.lead, [])
    role = VerticalPassive(ctx.channel, table.X, ctx.cfg.lead, params.max_bins, params.seed, ids=table.ids)
    pmodel = role.fit(ctx.checkpoint, ctx.resume)
    pmodel.feature_names = names(table)  # for fedgrove info, and test frames matched by name
    ctx.save_json(pmodel.to_dict())
    return {"owned_splits": len(pmodel.splits)}


def _vertical_active_predict(ctx: RoleContext) -> dict:
    model = ctx.load_model()
    table = ctx.common(ctx.data(with_label=True, test=True, model_names=model.metadata.get("own_feature_names")),
                       ctx.cfg.lead, ctx.others("passive"), test=True)
    raw = predict_active(ctx.channel, ctx.others("passive"), model, table.X, table.ids)
    return write_predictions(ctx, model.output_from_raw(raw), model.classes, table)


def _vertical_passive_predict(ctx: RoleContext) -> dict:
    part = ctx.load_part(PassiveModel.from_dict)
    table = ctx.common(ctx.data(False, test=True, model_names=part.feature_names), ctx.cfg.lead, [], test=True)
    answer_predict(ctx.channel, ctx.cfg.lead, part, table.X, table.ids)
    return {}


# ---------------------------------------------------------------------------- horizontal
def _horizontal_aggregator(ctx: RoleContext) -> dict:
    params = ctx.cfg.make_params()
    model = HorizontalAggregator(ctx.channel, ctx.others("client"), params,
                                 ctx.cfg.horizontal["contributions"]).fit(ctx.checkpoint, ctx.resume, ctx.progress)
    return _save_horizontal(ctx, model, params)


def _horizontal_client(ctx: RoleContext) -> dict:
    params = ctx.cfg.make_params()
    table = ctx.data(with_label=True)
    model = HorizontalClient(ctx.channel, table.X, table.y, ctx.cfg.lead, params,
                             ctx.cfg.horizontal["contributions"], schema(table),
                             sample_weight=table.weights).fit(ctx.checkpoint, ctx.resume)
    keep_names(model, table)
    if ctx.spec.weight is not None:  # for fedgrove info, and fedgrove predict (a file holding it: no feature)
        model.metadata["weight"] = ctx.spec.weight
    return _save_horizontal(ctx, model, params)


def _save_horizontal(ctx, model, params) -> dict:
    model.metadata.update({"protocol": "horizontal", "party": ctx.spec.name})
    if params.objective != "regression":
        model.classes = ctx.class_names(model.n_classes)
    model.save(ctx.model_path)
    return {"trees": model.n_trees, **({"contributions": model.metadata["contributions"]}
                                       if "contributions" in model.metadata else {})}


# ---------------------------------------------------------------------------- hybridtree
def _hybrid_host(ctx: RoleContext) -> dict:
    params, ht = ctx.cfg.make_params(), ctx.cfg.hybridtree
    table = ctx.data(with_label=True)
    if ht["guest_depth"] > 0 and ctx.others("guest"):  # else its rows' positions were taken for the guests' IDs
        _with_ids(ctx, table, "the host's file needs an _id column linking its rows to the guests' files")
    table = ctx.common(table, ctx.spec.name, ctx.others("guest"), everyone=False)
    hmodel = HybridHost(ctx.channel, table.X, table.y, ctx.others("guest"), params, ctx.key_pair(),
                        ht["host_depth"], ht["guest_depth"], ids=table.ids, mode=ht["mode"],
                        shared_only=ht["shared_only"], rows_per_ciphertext=ctx.cfg.he.get("rows_per_ciphertext"),
                        sample_weight=table.weights).fit(ctx.checkpoint, ctx.resume, ctx.progress)
    hmodel.feature_names = names(table)  # for fedgrove info's importance, and test frames matched by name
    ctx.save_json(hmodel.to_dict())
    return {"trees": len(hmodel.host_trees)}


def _hybrid_guest(ctx: RoleContext) -> dict:
    params = ctx.cfg.make_params()
    table = _with_ids(ctx, ctx.data(with_label=False), "a guest's file needs an _id column linking it to the host")
    table = ctx.common(table, ctx.cfg.lead, [], everyone=False)  # align = "psi": the rows the host holds
    role = HybridGuest(ctx.channel, table.X, table.ids, ctx.cfg.lead, params.max_bins, params.seed)
    role.fit(ctx.checkpoint, ctx.resume)
    role.model.feature_names = names(table)  # for fedgrove info, and test frames matched by name
    ctx.save_json(role.model_dict())
    return {"owned_splits": len(role.model.splits)}


def _hybrid_host_predict(ctx: RoleContext) -> dict:
    model = ctx.load_part(HybridHostModel.from_dict)
    table = ctx.data(with_label=True, test=True, model_names=model.feature_names)
    guests = ctx.others("guest") if ctx.cfg.hybridtree["guest_depth"] > 0 else []
    if guests:  # without IDs the host's test rows would be its positions 0..n-1, matched to the guests' IDs
        _with_ids(ctx, table, "the host's test file needs an _id column linking its rows to the guests' test files")
    raw = predict_hybrid(ctx.channel, guests, model, table.X, table.ids)
    n_classes = 1 if model.objective == "regression" else max(2, raw.shape[1])
    shell = GBDTModel(model.objective, n_classes, model.base_score)  # for its output transform
    classes = None if model.objective == "regression" else ctx.class_names(n_classes)
    return write_predictions(ctx, shell.output_from_raw(raw), classes, table)


def grows_no_trees(cfg, role: str) -> bool:
    """Whether a party of ``role`` takes part in no tree, so that it keeps no checkpoint and predicts nothing: a
    HybridTree guest when the guests grow no layers."""
    return cfg.protocol == "hybridtree" and role == "guest" and cfg.hybridtree["guest_depth"] == 0


def _hybrid_guest_predict(ctx: RoleContext) -> dict:
    if grows_no_trees(ctx.cfg, ctx.spec.role):
        return {}
    guest = ctx.load_part(lambda d: HybridGuest.from_model(ctx.channel, d, ctx.cfg.lead))
    table = _with_ids(ctx, ctx.data(False, test=True, model_names=guest.model.feature_names),
                      "a guest's test file needs an _id column")
    guest.predict(table.X, table.ids)
    return {}


def _with_ids(ctx, table, why: str):
    if table.ids is None:
        raise DataError(f"party {ctx.spec.name}: {why}")
    return table


# ---------------------------------------------------------------------- federated forest
def _forest_master(ctx: RoleContext) -> dict:
    model = ForestMaster(ctx.channel, ctx.others("client"), ctx.cfg.make_params(),
                         ctx.cfg.forest["label_mode"]).fit(ctx.checkpoint, ctx.resume, ctx.progress)
    if model.task == "classification":
        model.classes = ctx.class_names(model.n_classes)
    model.save(ctx.model_path)
    return {"trees": model.n_trees}


def _forest_client(ctx: RoleContext) -> dict:
    params = ctx.cfg.make_params()
    holder = ctx.spec.label is not None
    table = ctx.common(ctx.data(with_label=holder), *_forest_psi(ctx))
    he = ctx.key_pair() if ctx.holds_key else None
    role = ForestClient(ctx.channel, table.X, ctx.cfg.lead, y=table.y if holder else None, he=he,
                        max_bins=params.max_bins, seed=params.seed, ids=table.ids,
                        n_classes=len(ctx.cfg.classes) if ctx.cfg.classes else None,
                        sample_weight=table.weights if holder else None)
    pmodel = role.fit(ctx.checkpoint, ctx.resume)
    pmodel.feature_names = names(table)  # for fedgrove info, and test frames matched by name
    ctx.save_json(pmodel.to_dict())
    return {"owned_splits": len(pmodel.splits)}


def _forest_psi(ctx: RoleContext) -> tuple[str, list[str]]:
    """The clients' private set intersection: around the first client by name (every client can tell which
    that is, whatever its config lists), with the others."""
    clients = sorted([ctx.spec.name, *ctx.others("client")])
    return clients[0], (clients[1:] if ctx.spec.name == clients[0] else [])


def _forest_master_predict(ctx: RoleContext) -> dict:
    model = ctx.load_model()
    role = ForestMaster(ctx.channel, ctx.others("client"), ctx.cfg.make_params(), ctx.cfg.forest["label_mode"])
    out = role.predict(ctx.cfg.forest["prediction"], model)
    # the master holds no labels: its predictions are written, not scored (the label holder scores them)
    return write_predictions(ctx, out, model.classes, _Rows(role.test_ids, None))


def _forest_client_predict(ctx: RoleContext) -> dict:
    # the label holder's test labels, when its test file has them
    part = ctx.load_part(PassiveModel.from_dict)
    table = ctx.common(ctx.data(with_label=False, test=True, model_names=part.feature_names), *_forest_psi(ctx),
                       test=True)
    out = answer_predictions(ctx.channel, ctx.cfg.lead, part, table.X, table.ids, wants_scores=table.y is not None)
    if out is None:
        return {}
    classification = ctx.cfg.make_params().task == "classification"
    result = {"n_test": len(out), "scored_from": ctx.cfg.lead,
              **test_scores(out if classification else out[:, 0], table.y, classification, table.weights)}
    if table.weights is not None:
        result["test_weight"] = table.weight_name
    return result


# ------------------------------------------------------------------------------------- simfl
def _simfl_party(ctx: RoleContext) -> dict:
    params = ctx.cfg.make_params()
    table = ctx.data(with_label=True)
    party = SimFLParty(ctx.channel, table.X, table.y, params, ctx.cfg.simfl_options(), ids=table.ids,
                       cache=ctx.out_dir / f"{ctx.spec.name}.simfl-prep.npz", schema=schema(table),
                       sample_weight=table.weights)
    model = party.fit(ctx.checkpoint, ctx.resume, ctx.progress)
    keep_names(model, table)
    model.metadata["party"] = ctx.spec.name
    if ctx.spec.weight is not None:  # for fedgrove info, and fedgrove predict (a file holding it: no feature)
        model.metadata["weight"] = ctx.spec.weight
    if params.objective != "regression":
        model.classes = ctx.class_names(model.n_classes)
    model.save(ctx.model_path)
    return {"trees": model.n_trees, **party.timings}


def _local_predict(ctx: RoleContext) -> dict:
    """SimFL, FV-tree and the horizontal protocol's clients: every party holds the whole model and predicts its
    own test file, no message needed."""
    model = ctx.load_model()
    table = ctx.data(with_label=True, test=True, model_names=model.feature_names)
    return write_predictions(ctx, model.output_from_raw(model.predict_raw(table.X)), model.classes, table)


def _nothing_to_predict(ctx: RoleContext) -> dict:
    """The horizontal aggregator holds no test rows: its clients predict theirs on their own."""
    return {}


# ------------------------------------------------------------------------------------ fvtree
def _fvtree_party(ctx: RoleContext) -> dict:
    from fedgrove.crypto.signing import SigningKey
    from fedgrove.exceptions import InvalidParameterError
    from fedgrove.ledger.store import Ledger

    params = ctx.cfg.make_params()
    table = ctx.data(with_label=True)
    path = ctx.out_dir / f"{ctx.spec.name}.ledger.sqlite"
    key_path = ctx.out_dir / f"{ctx.spec.name}.ledger.key"  # the party's Ed25519 signing key: a resumed run signs on
    if ctx.resume:
        for f in (path, key_path):
            if not f.exists():
                raise InvalidParameterError(f"--resume: {f} from the interrupted run is missing (a resumed party "
                                            f"continues its ledger and signs with the same key)")
        key = SigningKey.load(key_path)
    else:
        if path.exists():
            raise InvalidParameterError(f"ledger {path} exists from an earlier run and is append-only: move it "
                                        f"away, choose another output directory, or continue it with --resume")
        key = SigningKey()
        key.save(key_path)
    ledger, done = Ledger(path), False
    try:
        party = FVTreeParty(ctx.channel, table.X, table.y, params, ctx.cfg.fvtree_options(), ledger=ledger,
                            key=key, schema=schema(table))
        model = party.fit(ctx.checkpoint, ctx.resume, ctx.progress)
        keep_names(model, table)
        done = True
    finally:
        ledger.close()
        # refused before its first record: the empty ledger and its key go, so that a rerun is not blocked
        if not done and not ctx.resume and ledger.count == 0:
            path.unlink(missing_ok=True)
            key_path.unlink(missing_ok=True)
    model.metadata["party"] = ctx.spec.name
    if params.objective != "regression":
        model.classes = ctx.class_names(model.n_classes)
    model.save(ctx.model_path)
    return {"trees": model.n_trees, "ledger": str(path), "ledger_records": ledger.count,
            "contributions": model.metadata["contributions"], "privacy": model.metadata.get("privacy"),
            "refused_uploads": model.metadata["refused_uploads"],
            "uploads_per_party": model.metadata["uploads_per_party"], "threshold": ctx.cfg.fvtree_options().threshold}


@dataclass
class _Rows:
    ids: np.ndarray | None
    y: np.ndarray | None

    @property
    def id_labels(self):  # the Federated Forest master, holding no file, knows text IDs by their codes only
        return self.ids


# ----------------------------------------------------------------------------- outputs
def write_predictions(ctx: RoleContext, out: np.ndarray, classes, table) -> dict:
    """``<party>.predictions.csv`` (``_id`` when known, the prediction, class probabilities) and, when the
    test labels are at hand, the test metrics (returned for the stats file)."""
    import pandas as pd

    out = np.asarray(out)
    if classes is not None:
        df = pd.DataFrame({"prediction": np.asarray(classes)[out.argmax(axis=1)]})
        for k, c in enumerate(classes):
            df[f"p_{c}"] = out[:, k]
    else:
        df = pd.DataFrame({"prediction": out})
    if table.ids is not None:
        df.insert(0, "_id", table.id_labels)
    path = ctx.out_dir / f"{ctx.spec.name}.predictions.csv"
    atomic_write_text(path, df.to_csv(index=False))
    result = {"predictions": str(path), "n_test": len(df)}
    if table.y is not None:
        result.update(test_scores(out, table.y, classes is not None, table.weights))
        if table.weights is not None:
            result["test_weight"] = table.weight_name
    return result


def test_scores(out: np.ndarray, y: np.ndarray, classification: bool, weights=None) -> dict:
    """Test metrics for the stats file: accuracy (and AUC for two classes) of class probabilities ``out``
    (rows, classes), or the RMSE of values ``out`` (rows,), against the label codes ``y``; each row weighted by
    ``weights`` when given."""
    y = np.asarray(y, dtype=np.float64)
    if not classification:
        return {"test_rmse": metrics.rmse(y, out, sample_weight=weights)}
    result = {"test_accuracy": metrics.accuracy(y, out.argmax(axis=1), sample_weight=weights)}
    if out.shape[1] == 2 and metrics.ranks_defined(y, weights):  # left out where every test label is one class
        result["test_auc"] = metrics.auc(y, out[:, 1], sample_weight=weights)
    return result


TRAIN = {
    ("vertical", "active"): _vertical_active, ("vertical", "passive"): _vertical_passive,
    ("horizontal", "aggregator"): _horizontal_aggregator, ("horizontal", "client"): _horizontal_client,
    ("hybridtree", "host"): _hybrid_host, ("hybridtree", "guest"): _hybrid_guest,
    ("federated-forest", "master"): _forest_master, ("federated-forest", "client"): _forest_client,
    ("simfl", "party"): _simfl_party,
    ("fvtree", "party"): _fvtree_party,
}
PREDICT = {
    ("vertical", "active"): _vertical_active_predict, ("vertical", "passive"): _vertical_passive_predict,
    ("hybridtree", "host"): _hybrid_host_predict, ("hybridtree", "guest"): _hybrid_guest_predict,
    ("federated-forest", "master"): _forest_master_predict, ("federated-forest", "client"): _forest_client_predict,
    ("horizontal", "client"): _local_predict, ("horizontal", "aggregator"): _nothing_to_predict,
    ("simfl", "party"): _local_predict,
    ("fvtree", "party"): _local_predict,
}
