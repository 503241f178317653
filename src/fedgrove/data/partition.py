"""Partition simulators: split one table into per-party files.

* horizontal: parties hold different samples of the same features —
  ``balanced`` (equal random split), ``unbalanced`` (SimFL's ratio theta: one
  subset takes theta of class 0 and 1 - theta of class 1, the other the rest;
  with more parties each subset is split equally), ``dirichlet`` (per class,
  proportions drawn from Dir(beta)).
* vertical: parties hold different features of the same samples (random,
  near-equal split); the first party holds the labels.
* hybrid (HybridTree, Appendix C): a host gets a random number of features
  (1..d-1), all samples and the labels; the other features go to guests, which
  split the samples.  Variants: several hosts (C.2: the host's samples split
  among hosts), guest label skew (C.3: Dir(beta) per host label), overlapping
  samples and heterogeneous guest features (C.4: each sample also goes to
  another guest with probability ``overlap``; each guest drops a random
  number of its features).

Every party file carries the global instance IDs in column ``_id``;
``manifest.json`` records the scheme, parameters and who holds what, so
:func:`join_partition` can put the table back together.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedgrove.data.io import Table, infer_objective, label_text, load_table, write_table
from fedgrove.exceptions import DataError, InvalidParameterError

MANIFEST = "manifest.json"


@dataclass
class PartyShard:
    name: str
    role: str
    rows: np.ndarray       # global row indices (= instance IDs), sorted
    features: np.ndarray   # global feature indices, sorted
    has_label: bool


@dataclass
class Partition:
    scheme: str
    shards: list[PartyShard]
    n_samples: int
    n_features: int
    params: dict = field(default_factory=dict)

    def shard(self, name: str) -> PartyShard:
        for s in self.shards:
            if s.name == name:
                return s
        raise KeyError(name)


def _check_parties(n_parties: int, minimum: int = 1, name: str = "n_parties") -> None:
    if isinstance(n_parties, bool) or not isinstance(n_parties, (int, np.integer)) or n_parties < minimum:
        raise InvalidParameterError(f"{name} must be an integer >= {minimum}, got {n_parties!r}")


def refuse_empty(parts: list[np.ndarray], names: list[str], n: int, name: str, skewed: bool,
                 noun: str = "parties") -> None:
    """A party without rows cannot train: refused, naming the parties and what to change (``name`` is the
    parameter that sets their number; ``skewed``: a Dirichlet split, whose beta matters too)."""
    empty = [who for who, p in zip(names, parts) if len(p) == 0]
    if empty:
        raise InvalidParameterError(
            f"{name}: {len(empty)} of {len(parts)} {noun} would hold no rows ({', '.join(empty[:5])}"
            f"{', ...' if len(empty) > 5 else ''}) of {n}: use fewer {noun}"
            + (" or a larger beta (less skew)" if skewed else ""))


def _split_equally(rows: np.ndarray, k: int, rng) -> list[np.ndarray]:
    return [np.sort(p) for p in np.array_split(rng.permutation(rows), k)]


def _dirichlet_split(y: np.ndarray, rows: np.ndarray, k: int, beta: float, rng) -> list[np.ndarray]:
    if not beta > 0:
        raise InvalidParameterError(f"beta must be > 0 (the Dirichlet concentration), got {beta!r}")
    parts = [[] for _ in range(k)]
    for cls in np.unique(y[rows]):
        idx = rng.permutation(rows[y[rows] == cls])
        p = rng.dirichlet(np.full(k, beta))
        cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
        for j, chunk in enumerate(np.split(idx, cuts)):
            parts[j].append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]


def seeded(seed, *stream: int) -> np.random.Generator:
    """The generator of a partition's random step: ``seed`` (a whole number >= 0, refused by name otherwise; numpy
    said "expected non-negative integer") and, for a separate stream, a constant."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidParameterError(f"seed must be a whole number >= 0, got {seed!r}")
    return np.random.default_rng([int(seed), *stream] if stream else int(seed))


def horizontal_partition(y: np.ndarray, n_parties: int, mode: str = "balanced", theta: float = 0.8,
                         beta: float = 0.5, seed: int = 0) -> Partition:
    _check_parties(n_parties, 1)
    y = np.asarray(y)
    rng = seeded(seed)
    rows = np.arange(len(y))
    n_features = -1  # filled by write/use; horizontal parties hold every feature
    if mode == "balanced":
        parts = _split_equally(rows, n_parties, rng)
    elif mode == "unbalanced":
        if not 0.0 < theta < 1.0:
            raise InvalidParameterError(f"theta must be in (0, 1), got {theta!r}")
        classes = np.unique(y)
        if len(classes) != 2:
            raise DataError(f"the unbalanced partition splits the two classes by theta, so it needs a label with "
                            f"exactly two classes, got {len(classes)} distinct values: use mode balanced (or "
                            f"dirichlet, for label skew over several classes)")
        if n_parties < 2:
            raise InvalidParameterError(f"n_parties must be >= 2 for the unbalanced partition, got {n_parties}")
        a_parts, b_parts = [], []
        for cls, share in ((classes[0], theta), (classes[1], 1.0 - theta)):
            idx = rng.permutation(rows[y == cls])
            cut = int(round(share * len(idx)))
            a_parts.append(idx[:cut])
            b_parts.append(idx[cut:])
        a, b = np.concatenate(a_parts), np.concatenate(b_parts)
        n_a = (n_parties + 1) // 2
        parts = _split_equally(a, n_a, rng) + _split_equally(b, n_parties - n_a, rng)
    elif mode == "dirichlet":
        parts = _dirichlet_split(y, rows, n_parties, beta, rng)
    else:
        raise InvalidParameterError(f"horizontal mode must be balanced, unbalanced or dirichlet, got {mode!r}")
    refuse_empty(parts, [f"party{j}" for j in range(len(parts))], len(y), "n_parties", mode == "dirichlet")
    shards = [PartyShard(f"party{j}", "party", p, np.zeros(0, dtype=np.int64), True) for j, p in enumerate(parts)]
    return Partition("horizontal", shards, len(y), n_features,
                     {"mode": mode, "theta": theta, "beta": beta, "seed": seed})


def vertical_partition(n_samples: int, n_features: int, n_parties: int, seed: int = 0) -> Partition:
    _check_parties(n_parties, 1)
    if n_parties > n_features:
        raise InvalidParameterError(f"n_parties: cannot split {n_features} features among {n_parties} parties")
    rng = seeded(seed)
    feats = _split_equally(np.arange(n_features), n_parties, rng)
    rows = np.arange(n_samples)
    shards = [PartyShard(f"party{j}", "active" if j == 0 else "passive", rows, f, j == 0)
              for j, f in enumerate(feats)]
    return Partition("vertical", shards, n_samples, n_features, {"seed": seed})


def hybrid_partition(y: np.ndarray, n_features: int, n_guests: int = 5, n_hosts: int = 1, seed: int = 0,
                     beta: float | None = None, overlap: float = 0.0, drop_features: bool = False,
                     n_host_features: int | None = None) -> Partition:
    _check_parties(n_guests, 1, "n_guests")
    _check_parties(n_hosts, 1, "n_hosts")
    if n_features < 2:
        raise InvalidParameterError("the hybrid partition needs at least 2 features")
    if not 0.0 <= overlap <= 1.0:
        raise InvalidParameterError(f"overlap must be in [0, 1], got {overlap!r}")
    y = np.asarray(y)
    n = len(y)
    rng = seeded(seed)
    perm = rng.permutation(n_features)
    d_host = n_host_features if n_host_features is not None else int(rng.integers(1, n_features))
    if not 1 <= d_host < n_features:
        raise InvalidParameterError(f"n_host_features must be in [1, {n_features - 1}], got {d_host!r}")
    host_feats, guest_feats = np.sort(perm[:d_host]), np.sort(perm[d_host:])
    rows = np.arange(n)
    host_rows = _split_equally(rows, n_hosts, rng) if n_hosts > 1 else [rows]
    if beta is not None:
        guest_rows = _dirichlet_split(y, rows, n_guests, beta, rng)
    else:
        guest_rows = _split_equally(rows, n_guests, rng)
    if overlap > 0 and n_guests > 1:
        owner = np.empty(n, dtype=np.int64)
        for j, r in enumerate(guest_rows):
            owner[r] = j
        extra = rng.random(n) < overlap
        other = (owner + rng.integers(1, n_guests, n)) % n_guests
        guest_rows = [np.sort(np.concatenate([guest_rows[j], rows[extra & (other == j)]])) for j in range(n_guests)]
    host_names = [f"host{h}" if n_hosts > 1 else "host" for h in range(n_hosts)]
    refuse_empty(host_rows, host_names, n, "n_hosts", False, "hosts")
    shards = [PartyShard(name, "host", r, host_feats, True) for name, r in zip(host_names, host_rows)]
    for j, r in enumerate(guest_rows):
        feats = guest_feats
        if drop_features and len(guest_feats) > 1:
            n_drop = int(rng.integers(0, len(guest_feats)))
            feats = np.sort(rng.choice(guest_feats, len(guest_feats) - n_drop, replace=False))
        shards.append(PartyShard(f"guest{j}", "guest", r, feats, False))
    return Partition("hybrid", shards, n, n_features,
                     {"n_guests": n_guests, "n_hosts": n_hosts, "seed": seed, "beta": beta, "overlap": overlap,
                      "drop_features": drop_features})


def file_names(partition: Partition, format: str = "csv", test: bool = False) -> list[str]:
    """The names of the party files :func:`write_partition` writes (and with ``test`` those of
    :func:`write_test_files`: one per party, or one ``test`` file for a horizontal partition)."""
    names = [f"{s.name}.{format}" for s in partition.shards]
    if test:
        names += [f"test.{format}"] if partition.scheme == "horizontal" else \
            [f"{s.name}-test.{format}" for s in partition.shards]
    return names


def write_partition(partition: Partition, table: Table, out_dir, format: str = "csv") -> list[Path]:
    """Write one file per party and a manifest; returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if format not in ("csv", "parquet"):
        raise InvalidParameterError(f"format must be csv or parquet, got {format!r}")
    written = []
    with_ids = _with_ids(table)
    entries = []
    classes = label_classes(table.y) if table.y is not None else None
    for s, name in zip(partition.shards, file_names(partition, format)):
        feats = s.features if (partition.scheme != "horizontal") else np.arange(table.n_features)
        part = with_ids.subset(s.rows, feats, with_label=s.has_label)
        path = out_dir / name
        write_table(part, path, format)
        written.append(path)
        entries.append({"name": s.name, "role": s.role, "file": path.name, "n_samples": int(len(s.rows)),
                        "features": [table.feature_names[j] for j in feats], "has_label": bool(s.has_label)})
        if s.has_label and classes:
            entries[-1]["label_counts"] = label_counts(table.y[s.rows], classes)
    manifest = {"scheme": partition.scheme, "params": partition.params, "n_samples": table.n_samples,
                "feature_names": table.feature_names, "label": table.label_column, "parties": entries}
    if table.categories:  # the party files hold these columns' codes: a category's code is its position here
        manifest["categories"] = table.categories
    if table.weights is not None:  # the labelled parties' files hold the rows' weights in this column
        manifest["weight"] = table.weight_name
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, default=_json_default), encoding="utf-8")
    written.append(out_dir / MANIFEST)
    return written


def label_classes(y: np.ndarray) -> list | None:
    """The classes of a label column, as ``fedgrove train`` takes them; ``None`` for a numeric target."""
    return None if infer_objective(y) == "regression" else np.unique(y).tolist()


def label_counts(y: np.ndarray, classes: list) -> dict[str, int]:
    """How many rows of each class (every class of ``classes``, zero where none), by the class as text."""
    values, counts = np.unique(y, return_counts=True)
    held = dict(zip(values.tolist(), counts.tolist()))
    return {label_text(c): int(held.get(c, 0)) for c in classes}


def label_mix(counts: dict[str, int]) -> str:
    """A party's classes in a few words: each share for up to three classes, else how many it holds and the
    largest."""
    total = sum(counts.values())
    if not total:
        return "no rows"
    if len(counts) <= 3:
        return ", ".join(f"{c} {100 * n / total:.0f}%" for c, n in counts.items())
    top = max(counts, key=counts.get)
    held = sum(1 for n in counts.values() if n)
    return f"{held} of {len(counts)} classes, most {top} {100 * counts[top] / total:.0f}%"


def hold_out(table: Table, fraction: float, seed: int = 0) -> tuple[Table, Table]:
    """A random ``fraction`` of the rows as a test table; both keep the original instance IDs."""
    if not 0.0 < fraction < 1.0:
        raise InvalidParameterError(f"fraction must be in (0, 1) (the rows held out as a test set), got "
                                    f"{fraction!r}")
    n = table.n_samples
    n_test = int(round(fraction * n))
    if not 1 <= n_test < n:
        raise InvalidParameterError(f"fraction {fraction} leaves no test or no training rows of {n}")
    order = seeded(seed, 7).permutation(n)
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
    with_ids = _with_ids(table)
    return with_ids.subset(train), with_ids.subset(test)


def _with_ids(table: Table) -> Table:
    """``table`` with instance IDs: its own, else the row numbers 0..n-1 (every party file carries IDs)."""
    return table if table.ids is not None else dataclasses.replace(table, ids=np.arange(table.n_samples))


def write_test_files(partition: Partition, test: Table, out_dir, format: str = "csv", seed: int = 0) -> list[Path]:
    """Each party's part of a held-out test table, ``<party>-test.<format>``: the party's features of the test
    instances it holds (vertical: every party all of them; hybrid: hosts all, guests an equal share each;
    horizontal: one ``test`` file with every feature, since each party holds the whole model).  Parties
    that hold the labels get them.  Recorded in the manifest as ``test_file``."""
    out_dir = Path(out_dir)
    written = []
    manifest = read_manifest(out_dir)
    n = test.n_samples
    test = _with_ids(test)
    names = file_names(partition, format, test=True)[len(partition.shards):]
    if partition.scheme == "horizontal":
        path = out_dir / names[0]
        write_table(test, path, format)
        manifest["test_file"] = path.name
        written.append(path)
    else:
        guests = [s.name for s in partition.shards if s.role == "guest"]
        shares = dict(zip(guests, _split_equally(np.arange(n), len(guests), seeded(seed, 11))
                          if guests else []))
        for s, entry, name in zip(partition.shards, manifest["parties"], names):
            rows = np.sort(shares[s.name]) if s.name in shares else np.arange(n)
            part = test.subset(rows, s.features, with_label=s.has_label)
            path = out_dir / name
            write_table(part, path, format)
            entry["test_file"] = path.name
            written.append(path)
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, default=_json_default), encoding="utf-8")
    return written


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o).__name__)


def read_manifest(directory, check: bool = True) -> dict:
    """A partition's manifest; with ``check``, refused unless it has the fields that :func:`write_partition`
    writes, of their types (a damaged or hand-edited one raised KeyError or TypeError where it was read)."""
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise DataError(f"{str(directory)!r} has no {MANIFEST}; is it a partition written by fedgrove?")
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{str(path)!r} is not valid JSON: {exc}") from None
    if check and (why := _manifest_fault(m)):
        raise DataError(f"{str(path)!r} is damaged: {why}; partition the data again (fedgrove partition writes it)")
    return m


def _manifest_fault(m) -> str | None:
    """What is wrong with a manifest's form, or None."""
    def kind(v, types):
        return isinstance(v, types) and not (isinstance(v, bool) and bool not in types)

    if not isinstance(m, dict):
        return "it is not a JSON object"
    for key, types in (("scheme", (str,)), ("n_samples", (int,)), ("parties", (list,))):
        if not kind(m.get(key), types):
            return f"{key} is {m.get(key)!r}"
    if m.get("label") is not None and not kind(m["label"], (str, int)):
        return f"label is {m['label']!r}"
    cats = m.get("categories")
    if cats is not None and not (isinstance(cats, dict) and all(isinstance(v, list) for v in cats.values())):
        return f"categories is {cats!r}"
    for k, e in enumerate(m["parties"]):
        if not isinstance(e, dict):
            return f"party #{k} is {e!r}"
        for key, types in (("name", (str,)), ("role", (str,)), ("file", (str,)), ("n_samples", (int,)),
                           ("features", (list,)), ("has_label", (bool,))):
            if not kind(e.get(key), types):
                return f"party #{k}'s {key} is {e.get(key)!r}"
        if e.get("label_counts") is not None and not (isinstance(e["label_counts"], dict) and all(
                kind(n, (int,)) for n in e["label_counts"].values())):
            return f"party #{k}'s label_counts is {e['label_counts']!r}"
    return None


def read_partition(directory) -> tuple[dict, dict[str, Table]]:
    """The manifest and each party's table, keyed by party name."""
    manifest = read_manifest(directory)
    tables = {}
    for p in manifest["parties"]:
        label = manifest["label"] if p["has_label"] else None
        tables[p["name"]] = load_table(Path(directory) / p["file"], label=label)
    return manifest, tables


def join_partition(directory, test: bool = False) -> Table:
    """Reassemble the original table from a partition directory: rows by instance ID (ascending), features
    in the original order, text columns' codes with their categories from the manifest.  ``test=True``
    joins the held-out test files instead (``fedgrove partition --test-fraction``).  A value no party
    holds is missing (NaN)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    names = manifest["feature_names"]
    key = "test_file" if test else "file"
    if test and manifest["scheme"] == "horizontal":
        sources = [(manifest.get(key), True)]
    else:
        sources = [(p.get(key), p["has_label"]) for p in manifest["parties"]]
    if any(f is None for f, _ in sources):
        raise DataError(f"the partition in {str(directory)!r} has no test files; write them with "
                        f"fedgrove partition --test-fraction")
    tables = [load_table(directory / f, label=manifest["label"] if has_label else None) for f, has_label in sources]
    ids = np.unique(np.concatenate([np.asarray(t.ids) for t in tables]))
    if not test and len(ids) != manifest["n_samples"]:
        raise DataError(f"the party files in {str(directory)!r} hold {len(ids)} instances; the manifest says "
                        f"{manifest['n_samples']}")
    col = {name: j for j, name in enumerate(names)}
    X = np.full((len(ids), len(names)), np.nan)
    labels = [t.y for t in tables if t.y is not None]
    text = any(np.asarray(v).dtype.kind not in "fiub" for v in labels)
    y = np.full(len(ids), None, dtype=object) if text else np.full(len(ids), np.nan)
    id_text = np.empty(len(ids), dtype=object) if any(t.id_text is not None for t in tables) else None
    for t in tables:
        rows = np.searchsorted(ids, np.asarray(t.ids))
        X[np.ix_(rows, [col[f] for f in t.feature_names])] = t.X
        if t.y is not None:
            y[rows] = t.y
        if id_text is not None:
            id_text[rows] = [str(v) for v in t.id_labels]
    return Table(X, y, names, manifest["label"], ids, categories=dict(manifest.get("categories") or {}),
                 id_text=id_text)
