import json

import numpy as np
import pytest

from fedgrove.engine.forest import ForestParams, train_forest
from fedgrove.engine.gbdt import GBDTParams, train_gbdt
from fedgrove.engine.model import FORMAT_VERSION, load_model, model_from_dict
from fedgrove.exceptions import DataError, ModelFormatError
from tests.conftest import make_classification


@pytest.fixture(scope="module")
def models():
    X, y = make_classification(1500, missing=0.05)
    y3 = np.digitize(X[:, 1], [-0.5, 0.5]).astype(float)
    return X, [
        train_gbdt(GBDTParams(n_estimators=5, max_depth=4), X, y),
        train_gbdt(GBDTParams("multiclass", n_estimators=3, max_depth=3), X, y3),
        train_gbdt(GBDTParams("regression", n_estimators=3, max_depth=3), X, np.nan_to_num(X[:, 0])),
        train_forest(ForestParams(n_estimators=4, max_depth=5), X, y3),
    ]


def test_a_classifier_trained_in_python_names_its_classes_0_to_k_minus_1(models, tmp_path):
    # classes were None for models the library trained; fedgrove predict took such a file for a regression model
    # (an RMSE for a binary model, --proba refused as "a regression model")
    X, ms = models
    assert [m.classes for m in ms] == [[0, 1], [0, 1, 2], None, [0, 1, 2]]
    ms[0].save(tmp_path / "m.json")
    assert load_model(tmp_path / "m.json").classes == [0, 1]


def test_save_load_gives_identical_predictions(models, tmp_path):
    X, ms = models
    for i, m in enumerate(ms):
        path = tmp_path / f"m{i}.json"
        m.save(path)
        loaded = load_model(path)
        np.testing.assert_array_equal(loaded.predict(X), m.predict(X))
        np.testing.assert_array_equal(loaded.predict_leaf(X), m.predict_leaf(X))


def test_other_version_is_refused_with_both_versions_named(models, tmp_path):
    d = models[1][0].to_dict()
    d["version"] = FORMAT_VERSION + 1
    path = tmp_path / "future.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ModelFormatError, match=f"version {FORMAT_VERSION + 1}.*reads version {FORMAT_VERSION}"):
        load_model(path)


@pytest.mark.parametrize("damage", ["truncate", "not-a-model", "bad-child", "shared-child", "missing-field", "binary",
                                    "negative-feature", "feature-past-the-width"])
def test_corrupt_files_give_a_clear_error(models, tmp_path, damage):
    text = json.dumps(models[1][0].to_dict())
    path = tmp_path / "bad.json"
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "not-a-model":
        path.write_text(json.dumps({"hello": 1}))
    elif damage == "bad-child":
        d = json.loads(text)
        d["trees"][0]["nodes"]["left"][0] = 10_000
        path.write_text(json.dumps(d))
    elif damage == "shared-child":  # links that point forward but make one node the child of two
        d = json.loads(text)
        nodes = d["trees"][0]["nodes"]
        k = nodes["left"][0]
        assert nodes["feature"][k] >= 0
        nodes["right"][0] = nodes["left"][k]
        path.write_text(json.dumps(d))
    elif damage == "missing-field":
        d = json.loads(text)
        del d["trees"][0]["nodes"]["threshold"]
        path.write_text(json.dumps(d))
    elif damage in ("negative-feature", "feature-past-the-width"):  # kernels would read outside the row
        d = json.loads(text)
        d["trees"][0]["nodes"]["feature"][0] = -5 if damage == "negative-feature" else len(d["bin_mapper"]["cuts"])
        path.write_text(json.dumps(d))
    else:
        path.write_bytes(b"\x00\xff\xfe")
    # the shared child passes the check of each link alone: the message names what is wrong
    with pytest.raises(ModelFormatError, match="bad.json.*child of two" if damage == "shared-child" else "bad.json"):
        load_model(path)


@pytest.mark.parametrize("which, field, value, said", [
    (1, ("tree_class", 0), 10 ** 9, "tree_class holds 1000000000, expected an output in \\[0, 2\\]"),
    (0, ("tree_class", 0), -1, "tree_class holds -1, expected an output in \\[0, 0\\]"),
    (1, ("base_score",), [0.0], "base_score has 1 entries, expected 3"),
    (0, ("trees", 0, "values"), [[0.0, 1.0]] * 31, "tree 0 has 2 values a node, expected 1"),
    (3, ("trees", 0, "values", 0), [0.5], "tree 0 has 1 values a node, expected 3"),
    (0, ("trees", 0, "nodes", "left", 0), 10 ** 30, "malformed tree record"),
    (0, ("trees", 0, "nodes", "missing_left", 0), -1, "malformed tree record"),
    (0, ("metadata",), "x", "its metadata is a str, expected a dict"),
    (0, ("kind",), ["gbdt"], "unknown model kind"),
    # the command line read these unchecked: tracebacks from fedgrove predict and fedgrove info
    (0, ("classes",), [0, 1, 2], "classes \\[0, 1, 2\\]: expected 2 distinct names or numbers"),
    (3, ("classes", 0), [1], "classes .*expected 3 distinct"),
    (2, ("classes",), ["a", "b"], "a regression model has classes"),
    (0, ("base_score", 0), None, "base_score \\[nan\\] is not finite"),
    (0, ("metadata", "label"), ["y"], "metadata label is \\['y'\\], expected a column name or number"),
    (0, ("metadata", "categories"), {"c": 3}, "metadata categories .*expected a list of distinct categories per"),
    (0, ("metadata", "categories"), {"c": ["a", "b", "a"]}, "metadata categories .*expected a list of distinct"),
    (0, ("fedgrove_version",), [1], "fedgrove_version is \\[1\\]"),
    (0, ("metadata", "clients"), [["party0"]], "metadata clients is .*expected a list of party names"),
    # a NaN leaf gave NaN predictions (fedgrove predict --label: sklearn's "Input contains NaN" traceback); a
    # best_iteration beyond the rounds was taken as it was
    (0, ("trees", 0, "values", -1), [None], "tree 0's leaf \\(node \\d+\\) has the value \\[nan\\], not a finite"),
    (3, ("trees", 1, "values", -1), [0.5, "inf", 0.5], "tree 1's leaf .*not a finite number"),
    (0, ("best_iteration",), 5, "best_iteration 5 is not a round of the model's 5"),
    (0, ("best_iteration",), -1, "best_iteration -1 is not a round"),
    (0, ("best_iteration",), True, "best_iteration True is not a round"),
])
def test_parts_of_a_model_file_that_do_not_fit_together_are_refused(models, tmp_path, which, field, value, said):
    # a tree_class beyond the model's outputs crashed the process (a segmentation fault in the prediction kernel,
    # which indexes the outputs by it unchecked); the others raised AttributeError, OverflowError or TypeError
    X, ms = models
    d = json.loads(json.dumps(ms[which].to_dict()))
    if field == ("trees", 0, "values"):
        value = [[0.0, 1.0]] * len(d["trees"][0]["values"])
    if field == ("trees", 0, "values", 0):  # a forest of 3 classes: every node's row of 1 value
        field, value = ("trees", 0, "values"), [[0.5]] * len(d["trees"][0]["values"])
    at = d
    for k in field[:-1]:
        at = at[k]
    at[field[-1]] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ModelFormatError, match="bad.json.*" + said):
        load_model(path).predict(X[:5])


def test_a_model_cut_before_its_best_iteration_forgets_it_and_still_loads(models, tmp_path):
    X, ms = models
    m = model_from_dict(ms[0].to_dict())  # a copy: 5 rounds
    m.best_iteration = 3
    m.truncate(4)
    assert m.best_iteration == 3
    m.truncate(2)
    assert m.best_iteration is None
    m.save(tmp_path / "cut.json")
    back = load_model(tmp_path / "cut.json")
    assert back.best_iteration is None and back.n_trees == 2
    np.testing.assert_array_equal(back.predict_raw(X[:50]), m.predict_raw(X[:50]))


def test_failed_save_leaves_previous_file(models, tmp_path, monkeypatch):
    path = tmp_path / "m.json"
    models[1][0].save(path)
    before = path.read_text()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr("fedgrove.engine.model.json.dumps", boom)
    with pytest.raises(RuntimeError):
        models[1][1].save(path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_checkpoint_text_equals_json_dumps_and_tree_dicts_follow_their_arrays(models, tmp_path):
    """Per-tree checkpoints and model files reuse each finished tree's JSON text: the file must read back the
    values a plain json.dumps writes, and a tree whose arrays change must not keep its old text."""
    from fedgrove import jsontext
    from fedgrove.runner.checkpoint import CheckpointStore

    model = models[1][0]
    state = {"trees_done": len(model.trees), "model": model.to_dict(), "other": {"k": [1, 2.5, None]}}
    assert json.loads(jsontext.dumps(state)) == json.loads(json.dumps(state))
    assert jsontext.dumps(state) != json.dumps(state)  # (the trees' compact texts from orjson)
    store = CheckpointStore(tmp_path / "p.checkpoint.json")
    store.save(state, np.arange(6.0).reshape(3, 2))
    back = store.load()
    assert json.dumps(back["model"]) == json.dumps(state["model"]) and back["trees_done"] == len(model.trees)
    tree = model.trees[0]
    first = tree.to_dict()
    assert tree.to_dict() is first  # memoised while the arrays are unchanged
    with pytest.raises(TypeError):
        first["values"] = []
    # its arrays are read-only now: a tree changes by new arrays, or by an array made writeable again
    with pytest.raises(ValueError, match="read-only"):
        tree.values[0, 0] += 1.0
    old_values = tree.values
    tree.values = tree.values + 1.0
    second = tree.to_dict()
    assert second is not first and second["values"][0][0] == first["values"][0][0] + 1.0
    assert json.loads(jsontext.dumps({"t": [second]}))["t"][0]["values"][0][0] == second["values"][0][0]
    assert tree.to_dict() is second
    tree.values.flags.writeable = True
    assert tree.to_dict() is second  # (unchanged content: the same dict)
    tree.values.flags.writeable = True
    tree.values[0, 0] = first["values"][0][0]
    third = tree.to_dict()
    assert third is not second and third["values"][0] == first["values"][0] != second["values"][0]
    tree.nodes.flags.writeable = True
    tree.nodes["gain"][0] += 1.0
    assert tree.to_dict()["nodes"]["gain"][0] == first["nodes"]["gain"][0] + 1.0
    tree.nodes.flags.writeable = True
    tree.nodes["gain"][0] -= 1.0
    tree.values = old_values
    # arrays that view another's data stay writeable, and are compared each time
    from fedgrove.engine.tree import Tree

    flat = old_values.ravel().copy()
    viewing = Tree(tree.nodes.copy(), flat.reshape(-1, 1))
    assert viewing.to_dict()["values"][0][0] == flat[0]
    flat[0] += 2.0
    assert viewing.to_dict()["values"][0][0] == flat[0] and viewing.values.flags.writeable
    # a model whose trees hold memoised dicts still copies and pickles
    import copy
    import pickle

    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert json.dumps(twin.to_dict()) == json.dumps(model.to_dict())


def test_a_dataframe_is_matched_to_the_features_by_name():
    import pandas as pd

    from fedgrove.exceptions import DataError

    X, y = make_classification(300, 4, seed=3)
    df = pd.DataFrame(X, columns=["w", "x", "y", "z"])
    valid = df[["z", "y", "x", "w"]]  # the evaluation set, matched by name too
    scores = {"frame": [], "array": []}
    params = GBDTParams(objective="binary", n_estimators=10, max_depth=3)
    gbdt = train_gbdt(params, df, y, eval_set=(valid, y),
                      callbacks=[lambda env: scores["frame"].append(env.eval_result)])
    forest = train_forest(ForestParams(n_estimators=5, max_depth=3), df, y)
    for m in (gbdt, forest):
        assert m.feature_names == ["w", "x", "y", "z"]
        expected = m.predict_proba(X)
        np.testing.assert_array_equal(m.predict_proba(df[["z", "x", "w", "y"]].assign(extra=1.0)), expected)
        with pytest.raises(DataError, match="'y'"):
            m.predict(df[["z", "x", "w"]])
    train_gbdt(params, X, y, eval_set=(X, y), callbacks=[lambda env: scores["array"].append(env.eval_result)])
    assert len(scores["frame"]) == 10 and scores["frame"] == scores["array"]


def test_values_that_are_not_numbers_are_named():
    import pandas as pd

    from fedgrove.exceptions import DataError

    X, y = make_classification(100, 3, seed=4)
    X = X[:, :2]
    params = GBDTParams(objective="binary", n_estimators=2, max_depth=2)
    with pytest.raises(DataError, match=r"y holds 'no', not a number \(0/1 for binary.*numpy.unique"):
        train_gbdt(params, X, np.where(y > 0, "yes", "no"))  # was a ValueError from numpy
    frame = pd.DataFrame({"a": X[:, 0], "b": np.where(X[:, 1] > 0, "up", "down")})
    with pytest.raises(DataError, match=r"X column 'b' holds '(up|down)', not a number .*categorical='auto'"):
        train_forest(ForestParams(n_estimators=2), frame, y)
    model = train_gbdt(params, X, y)
    with pytest.raises(DataError, match=r"X holds 'x', not a number"):
        model.predict([[0.1, "x"]])


def test_saving_where_no_file_can_be_says_where_not_the_temporary_files_name(models, tmp_path):
    # the errors named '.m.json.x1y2.tmp', a file the caller never asked for
    model = models[1][0]
    with pytest.raises(FileNotFoundError, match=r"its directory '.*absent' does not exist: '.*absent/m\.json'"):
        model.save(tmp_path / "absent" / "m.json")
    with pytest.raises(IsADirectoryError, match=r"is a directory, where a file name belongs"):
        model.save(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_one_row_given_flat_is_told_how_to_give_it(models):
    X, fitted = models
    with pytest.raises(DataError, match=r"X must have shape \(n_samples, \d+\), got \(\d+,\); one row is "
                                        r"X\.reshape\(1, -1\)"):
        fitted[0].predict(X[0])
    np.testing.assert_array_equal(fitted[0].predict(X[0].reshape(1, -1)), fitted[0].predict(X[:1]))
    with pytest.raises(DataError, match=r"got \(3,\)$"):  # not a row of this model: no hint
        fitted[0].predict(X[0, :3])


def test_a_damaged_party_part_names_the_entry_at_fault():
    # "int() argument must be ... not 'NoneType'" said neither where nor what; a dict for a feature name was
    # taken as the name "{}"
    from fedgrove.engine.binning import BinMapper
    from fedgrove.protocols.vertical.passive import PassiveModel

    X = np.random.default_rng(0).normal(size=(50, 2))
    part = PassiveModel("guest0", BinMapper(8).fit(X), {(0, 3): (1, 2, False, 0.5), (1, 4): (0, 1, True, -0.2)},
                        {(0, 3): (7, 8), (1, 4): (9, 10)}, ["u", "v"])
    good = json.loads(json.dumps(part.to_dict()))
    loaded = PassiveModel.from_dict(good)  # (a file as fedgrove writes it: read at once)
    assert loaded.splits == part.splits and loaded.children == part.children
    # whole numbers written as floats by another writer: read entry by entry, to the same model
    floats = json.loads(json.dumps(good))
    floats["splits"][1][:4] = [float(v) for v in floats["splits"][1][:4]]
    floats["children"][0][2] = 7.0
    again = PassiveModel.from_dict(floats)
    assert again.splits == part.splits and again.children == part.children
    assert all(type(v) is int for k, (f, b, _, _) in again.splits.items() for v in (*k, f, b))

    def refused(change, match):
        d = json.loads(json.dumps(good))
        change(d)
        with pytest.raises(ModelFormatError, match=match):
            PassiveModel.from_dict(d)

    refused(lambda d: d["splits"][1].__setitem__(3, None),
            r"ValueError in split 1 \(\[1, 4, 0, None, 1, -0.2\]\): None is not a whole")
    refused(lambda d: d["splits"][0].__setitem__(0, 0.5), "0.5 is not a whole number")  # int() made it tree 0
    refused(lambda d: d["splits"][0].__setitem__(4, []), "missing_left must be 0 or 1")
    refused(lambda d: d["children"][1].pop(), r"ValueError in children entry 1 \(\[1, 4, 9\]\): not enough values")
    refused(lambda d: d["feature_names"].__setitem__(1, {}), "feature_names must be a list of names")
    refused(lambda d: d.__setitem__("splits", 5), "TypeError in its splits")
    refused(lambda d: d["splits"][1].__setitem__(0, True), "True is not a whole number")  # (a bool is an int)
    refused(lambda d: d["children"][0].__setitem__(3, False), "False is not a whole number")
    refused(lambda d: d["splits"][0].__setitem__(4, 2), "missing_left must be 0 or 1")
    refused(lambda d: d["splits"][0].__setitem__(5, "0.5"), "the threshold a number")
    refused(lambda d: d["splits"][0].__setitem__(5, None), r"TypeError in split 0")
    refused(lambda d: d["children"].__setitem__(0, (3, 4)), r"ValueError in children entry 0")
