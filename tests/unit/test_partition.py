import numpy as np
import pytest

from fedgrove.data.io import Table
from fedgrove.data.partition import (horizontal_partition, hybrid_partition, join_partition, read_partition,
                                     vertical_partition, write_partition)


@pytest.fixture
def table():
    r = np.random.default_rng(0)
    X = r.normal(size=(600, 9))
    X[r.random(X.shape) < 0.05] = np.nan
    y = (r.random(600) < 0.3).astype(float)
    return Table(X, y, [f"c{j}" for j in range(9)], "target")


def _covers_disjointly(parts, n):
    allrows = np.concatenate(parts)
    return len(allrows) == n and len(np.unique(allrows)) == n


@pytest.mark.parametrize("mode", ["balanced", "unbalanced", "dirichlet"])
def test_horizontal_partitions_cover_all_samples_once(table, mode):
    p = horizontal_partition(table.y, 4, mode, theta=0.8, beta=0.5, seed=1)
    assert _covers_disjointly([s.rows for s in p.shards], 600)


@pytest.mark.parametrize("mode,parties,beta,expected", [("balanced", 601, 0.5, "1 of 601 parties would hold no rows"),
                                                         ("dirichlet", 12, 0.005, "or a larger beta")])
def test_a_partition_that_leaves_a_party_without_rows_is_refused(table, mode, parties, beta, expected):
    from fedgrove.exceptions import InvalidParameterError

    with pytest.raises(InvalidParameterError, match=expected):
        horizontal_partition(table.y, parties, mode, beta=beta, seed=1)
    assert min(len(s.rows) for s in horizontal_partition(table.y, 600, "balanced", seed=1).shards) == 1


def test_a_hybrid_partition_refuses_hosts_without_rows_and_keeps_guests_without_rows(table):
    # a host without rows has nothing to train on; a guest without rows is part of the paper's label-skew runs
    # (Figure 8, Dirichlet beta 0.1), which leave it out (the CLI refuses to write its empty file)
    from fedgrove.exceptions import InvalidParameterError

    with pytest.raises(InvalidParameterError, match=r"n_hosts: 1 of 601 hosts would hold no rows \(host600\)"):
        hybrid_partition(table.y, 9, n_guests=2, n_hosts=601, seed=1)
    with pytest.raises(InvalidParameterError, match="n_guests must be an integer >= 1, got 0"):
        hybrid_partition(table.y, 9, n_guests=0, seed=1)
    p = hybrid_partition(table.y, 9, n_guests=12, seed=1, beta=0.01)
    assert min(len(s.rows) for s in p.shards if s.role == "guest") == 0


def test_a_negative_or_fractional_seed_is_refused_by_name(table):
    # numpy said "expected non-negative integer", and fedgrove partition --seed -1 printed its traceback
    from fedgrove.exceptions import InvalidParameterError

    for call in (lambda s: horizontal_partition(table.y, 2, seed=s), lambda s: vertical_partition(100, 4, 2, s),
                 lambda s: hybrid_partition(table.y, table.n_features, seed=s)):
        for bad in (-1, 1.5, True):
            with pytest.raises(InvalidParameterError, match=f"seed must be a whole number >= 0, got {bad!r}"):
                call(bad)
    a, b = horizontal_partition(table.y, 2, seed=np.int64(3)), horizontal_partition(table.y, 2, seed=3)
    assert all(np.array_equal(x.rows, y.rows) for x, y in zip(a.shards, b.shards))


def test_unbalanced_partition_has_the_theta_ratio(table):
    p = horizontal_partition(table.y, 2, "unbalanced", theta=0.8, seed=2)
    a = p.shards[0].rows
    n0, n1 = (table.y == 0).sum(), (table.y == 1).sum()
    assert abs((table.y[a] == 0).sum() - 0.8 * n0) <= 1 and abs((table.y[a] == 1).sum() - 0.2 * n1) <= 1


def test_the_unbalanced_partition_of_a_label_without_two_classes_says_what_to_use(table):
    from fedgrove.exceptions import DataError

    with pytest.raises(DataError, match="exactly two classes, got 600 distinct values: use mode balanced"):
        horizontal_partition(np.arange(600) / 7, 2, "unbalanced", seed=2)


def test_hybrid_partition_shapes(table):
    p = hybrid_partition(table.y, 9, n_guests=3, seed=4)
    host, guests = p.shards[0], p.shards[1:]
    assert host.has_label and len(host.rows) == 600 and not any(g.has_label for g in guests)
    assert _covers_disjointly([g.rows for g in guests], 600)
    assert set(host.features).isdisjoint(guests[0].features)
    assert len(host.features) + len(guests[0].features) == 9
    multi = hybrid_partition(table.y, 9, n_guests=3, n_hosts=2, seed=4)
    assert _covers_disjointly([s.rows for s in multi.shards if s.role == "host"], 600)
    skew = hybrid_partition(table.y, 9, n_guests=3, beta=0.1, seed=4)
    assert _covers_disjointly([g.rows for g in skew.shards[1:]], 600)
    over = hybrid_partition(table.y, 9, n_guests=3, overlap=0.5, drop_features=True, seed=4)
    assert sum(len(g.rows) for g in over.shards[1:]) > 600
    assert any(len(g.features) < len(guests[0].features) for g in over.shards[1:]) or len(guests[0].features) == 1


@pytest.mark.parametrize("scheme", ["horizontal", "vertical", "hybrid", "hybrid-overlap"])
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_partition_files_rejoin_to_the_original(table, tmp_path, scheme, fmt):
    if scheme == "horizontal":
        p = horizontal_partition(table.y, 3, "dirichlet", seed=5)
    elif scheme == "vertical":
        p = vertical_partition(600, 9, 3, seed=5)
    elif scheme == "hybrid":
        p = hybrid_partition(table.y, 9, n_guests=4, n_hosts=2, seed=5)
    else:
        p = hybrid_partition(table.y, 9, n_guests=4, overlap=0.3, seed=5)
    write_partition(p, table, tmp_path, fmt)
    back = join_partition(tmp_path)
    np.testing.assert_array_equal(back.X, table.X)
    np.testing.assert_array_equal(back.y, table.y)
    manifest, tables = read_partition(tmp_path)
    for s in p.shards:  # a party without labels has no label column in its file
        assert (tables[s.name].y is not None) == s.has_label


@pytest.mark.parametrize("scheme", ["horizontal", "vertical", "hybrid"])
def test_a_partition_with_a_test_set_rejoins_with_its_ids_labels_and_categories(tmp_path, scheme):
    """fedgrove partition --test-fraction --categorical auto on a file with class names: both joins give the
    original rows back by ID, and the categories reach the manifest (hold_out dropped them, and the join
    indexed its rows by ID, out of range once rows were held out, and could not hold class names)."""
    import pandas as pd

    from fedgrove.data.io import load_table
    from fedgrove.data.partition import hold_out, write_test_files

    r = np.random.default_rng(3)
    n = 200
    df = pd.DataFrame({"a": r.normal(size=n), "b": r.integers(0, 9, n).astype(float),
                       "city": r.choice(["x", "y", "z"], n), "y": r.choice(["no", "yes"], n)})
    df.to_csv(tmp_path / "d.csv", index=False)
    full = load_table(tmp_path / "d.csv", label="y", categorical="auto")
    train, test = hold_out(full, 0.25, seed=1)
    assert train.categories == test.categories == {"city": ["x", "y", "z"]}
    if scheme == "horizontal":
        p = horizontal_partition(train.y, 3, "balanced", seed=2)
    elif scheme == "vertical":
        p = vertical_partition(train.n_samples, 3, 2, seed=2)
    else:
        p = hybrid_partition(train.y, 3, n_guests=2, seed=2)
    out = tmp_path / "parts"
    write_partition(p, train, out)
    write_test_files(p, test, out, seed=2)
    for back, want in ((join_partition(out), train), (join_partition(out, test=True), test)):
        assert back.categories == {"city": ["x", "y", "z"]}
        np.testing.assert_array_equal(back.ids, want.ids)
        np.testing.assert_array_equal(back.X, want.X)
        assert list(back.y) == list(want.y) == list(df["y"][want.ids])


def test_joining_test_files_of_a_partition_without_them_is_refused(table, tmp_path):
    from fedgrove.exceptions import DataError

    write_partition(vertical_partition(600, 9, 2, seed=1), table, tmp_path)
    with pytest.raises(DataError, match="has no test files; write them with fedgrove partition --test-fraction"):
        join_partition(tmp_path, test=True)


def test_the_manifest_counts_each_labelled_partys_classes(table, tmp_path):
    from fedgrove.data.partition import read_manifest

    p = horizontal_partition(table.y, 3, "dirichlet", beta=0.1, seed=1)
    write_partition(p, table, tmp_path)
    entries = read_manifest(tmp_path)["parties"]
    for s, entry in zip(p.shards, entries):
        assert entry["label_counts"] == {"0": int((table.y[s.rows] == 0).sum()), "1": int((table.y[s.rows] == 1).sum())}
    # a numeric target has no classes to count; a party without the label has none either
    target = Table(table.X, table.X[:, 0] * 0 + np.arange(600) / 7.0, table.feature_names, "target")
    write_partition(horizontal_partition(target.y, 2, seed=1), target, tmp_path / "r")
    assert all("label_counts" not in e for e in read_manifest(tmp_path / "r")["parties"])
    v = vertical_partition(600, 9, 2, seed=1)
    write_partition(v, table, tmp_path / "v")
    assert ["label_counts" in e for e in read_manifest(tmp_path / "v")["parties"]] == [True, False]


def test_label_counts_and_mix():
    from fedgrove.data.partition import label_classes, label_counts, label_mix

    assert label_classes(np.array([1.0, -1.0, 1.0])) == [-1.0, 1.0]
    assert label_classes(np.array(["b", "a"], dtype=object)) == ["a", "b"]
    assert label_classes(np.array([0.5, 1.5, 2.0])) is None
    counts = label_counts(np.array([1.0, 1.0, 1.0]), [-1.0, 1.0])  # a class the party lacks is counted as 0
    assert counts == {"-1": 0, "1": 3}
    assert label_mix(counts) == "-1 0%, 1 100%"
    assert label_mix({"<=50K": 3, ">50K": 1}) == "<=50K 75%, >50K 25%"
    assert label_mix({str(k): n for k, n in enumerate([0, 5, 1, 4])}) == "3 of 4 classes, most 1 50%"
