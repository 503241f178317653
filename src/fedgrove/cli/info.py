"""``fedgrove info``: describe a model file, a data file or a partition directory."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.table import Table as RichTable

from fedgrove.cli.common import categorical_option, contributions_text, load_input, out
from fedgrove.data.io import label_text
from fedgrove.exceptions import listing


def info(
    path: str = typer.Argument(..., help="Model file, data file, partition directory or dataset:NAME"),
    label: Optional[str] = typer.Option(None, "--label", "-l", help="Label column of a data file"),
    fmt: Optional[str] = typer.Option(None, "--format", help="csv, parquet or libsvm for a data file (default: "
                                      "from extension)"),
    categorical: Optional[str] = typer.Option(None, help="Text columns of a data file as categories: 'auto' or "
                                              "comma-separated column names"),
    importance: Optional[str] = typer.Option(None, help="For a model: list every feature it splits on by this "
                                             "importance, 'gain' (summed split gains) or 'split' (splits)"),
):
    """Show what a model, data file or partition holds."""
    from fedgrove.data.partition import MANIFEST, label_mix, read_manifest
    from fedgrove.engine.model import IMPORTANCE_KINDS
    from fedgrove.exceptions import InvalidParameterError, ModelFormatError

    p = Path(path)
    if importance is not None and importance not in IMPORTANCE_KINDS:
        raise InvalidParameterError(f"--importance must be one of {', '.join(IMPORTANCE_KINDS)}, got "
                                    f"{importance!r}")
    if p.suffix.lower() == ".json" and not p.exists():
        raise ModelFormatError(f"model file {path!r} does not exist")
    if p.is_file() and p.name.endswith(".checkpoint.json"):
        with _damaged(p, "`fedgrove simulate` or `fedgrove party` writes it"):
            return _checkpoint_info(p)
    if p.is_file() and p.name.endswith((".stats.json", ".predict-stats.json")) and (one := _stats_file(p)):
        from fedgrove.cli.federation import _report

        with _damaged(p, "the run writes it"):
            return _report(dict([one]), p.parent)
    is_model = p.is_file() and _looks_like_model(p)
    if importance is not None and not is_model:
        raise InvalidParameterError(f"--importance is for a model file; {path} is not one")
    if p.is_dir() and (p / MANIFEST).exists():
        m = read_manifest(p)
        t = RichTable(title=f"{m['scheme']} partition of {m['n_samples']} samples, label column {m.get('label')!r}")
        for col in ("party", "role", "samples", "features", "label"):
            t.add_column(col)
        for party in m["parties"]:
            counts = party.get("label_counts")  # classes only; a manifest before 2026-11-25 has none
            label = label_mix(counts) if isinstance(counts, dict) and counts else "yes"
            t.add_row(party["name"], party["role"], str(party["n_samples"]), str(len(party["features"])),
                      label if party["has_label"] else "")
        out.print(t)
        for col, cats in (m.get("categories") or {}).items():  # the party files hold these columns' codes
            out.print(f"categories of {col} (codes 0..{len(cats) - 1}): {_categories_text(cats)}")
        return
    if is_model:
        with _damaged(p, "the party that trained it writes it"):
            return _model_info(p, importance)
    if p.is_dir() and (runs := _run_stats(p)):
        from fedgrove.cli.federation import _report

        with _damaged(p, "one of its <party>.stats.json files; the run writes them"):
            _report(runs, p)
        models = sorted(f.name for f in p.glob("*.model.json"))
        out.print(f"model files: {', '.join(models) or 'none'}" + ("; `fedgrove info` on one describes it"
                                                                     if models else ""))
        return
    if p.is_dir():
        from fedgrove.exceptions import DataError

        held = sorted(f.name.removesuffix(".checkpoint.json") for f in p.glob("*.checkpoint.json"))
        if held:  # a run stopped before it wrote its statistics
            raise DataError(f"{path} holds checkpoints of {', '.join(held)} but no run's statistics: a run that "
                            f"stopped before its end; `fedgrove info {p / (held[0] + '.checkpoint.json')}` shows "
                            f"how far it came, and --resume continues it")
        raise DataError(f"{path} is a directory that holds neither a partition (manifest.json) nor a federation "
                        f"run's statistics (<party>.stats.json); give a model, data or checkpoint file, a partition "
                        f"or a run's output directory (a ledger: `fedgrove ledger show`)")
    if p.is_file() and _head(p, 16) == b"SQLite format 3\x00":
        from fedgrove.exceptions import DataError

        raise DataError(f"{path} is an SQLite file, not a data file; an FV-tree ledger is shown by "
                        f"`fedgrove ledger show {path}` and checked by `fedgrove ledger verify {path}`")
    party = _partition_party(p) if label is None else None
    if party is not None and party["label"] is not None:  # a party file of a partition: its label column
        from fedgrove.data.io import feature_columns

        if party["label"] in (feature_columns(p, format=fmt) or []):
            label = party["label"]
    table = load_input(path, label, fmt, categorical=categorical_option(categorical))
    if party is not None and party.get("weight") and party["weight"] in table.feature_names:  # no feature
        from fedgrove.data.io import take_weights

        table = take_weights(table, party["weight"], repr(path), "the partition's weight")
    title = f"{path}: {table.n_samples} samples x {table.n_features} features"
    if party is not None:
        title += f" ({party['name']}'s {party['what']} file, {party['role']}, of the partition in {p.parent})"
    t = RichTable(title=title, show_header=False)
    t.add_column("field")
    t.add_column("value")
    t.add_row("missing values", str(int(np.isnan(table.X).sum())))
    if table.y is not None:
        values, counts = np.unique(table.y, return_counts=True)
        shown = ", ".join(f"{label_text(v)}: {c}" for v, c in list(zip(values, counts))[:10])  # -1, not -1.0
        t.add_row(f"label column {table.label_name!r}", shown + (" ..." if len(values) > 10 else ""))
    elif party is None and table.n_features:  # every column counted as a feature: say how to set the label apart
        t.add_row("label column", f"none given, so every column is counted as a feature (-l COLUMN names it; "
                                  f"`fedgrove train` takes the last, {table.feature_names[-1]!r}, by default)")
    if table.weights is not None:
        t.add_row(f"weight column {table.weight_name!r}", f"sum {table.weights.sum():.6g}, "
                  f"{int((table.weights == 0).sum())} rows of weight 0")
    t.add_row("features", ", ".join(table.feature_names[:12]) + (" ..." if table.n_features > 12 else ""))
    for col, cats in list(table.categories.items())[:12]:
        t.add_row(f"categories of {col}", f"{len(cats)}: " + ", ".join(cats[:8]) + (" ..." if len(cats) > 8 else ""))
    out.print(t)


def _model_info(p: Path, importance: str | None) -> None:
    """What a model file (whole, or a party's part of a federated model) holds."""
    from fedgrove.engine.model import load_model
    from fedgrove.exceptions import InvalidParameterError

    if (part := _federated_part(p)) is not None:
        part, host = part  # host: a HybridTree host's (gains, splits, labels, owners), its layers and guests'
        if importance is not None and host is None:
            raise InvalidParameterError(f"{p} is a party's part of a federated model: --importance reads a "
                                        "whole model file (the engine's, a horizontal, SimFL or FV-tree party's, "
                                        "a vertical active party's or a Federated Forest master's) or a "
                                        "HybridTree host's")
        if host is not None:
            part.append(("top features by gain", _top_features(host[0], host[2])))
            if len(set(host[3])) > 1:
                part.append(("gain by party", _gain_by_party(host[0], [(o, 0) for o in host[3]])))
        t = RichTable(title=str(p), show_header=False)
        t.add_column("field")
        t.add_column("value")
        for k, v in [("model", "a party's part of a federated model (predicts through the federation)"), *part]:
            t.add_row(k, v)
        out.print(t)
        if importance is not None:
            out.print(_importance_table(*host[:3], importance, "the host's and guests' "))
        return
    m = load_model(p)
    depth = max(tr.max_depth for tr in m.trees) if m.trees else 0
    per_round = m.n_outputs if m.kind == "gbdt" else 1
    rows = [("kind", m.kind), ("trees", _trees_text(m.n_trees, per_round)), ("deepest tree", str(depth)),
            ("features", _model_features(m)), ("classes", str(m.classes)),
            ("saved by fedgrove", m.written_by or "unknown")]
    if m.kind == "gbdt":
        rows.insert(1, ("objective", m.objective))
    if m.metadata.get("label") is not None:  # fedgrove predict scores a file holding this column
        rows.insert(rows.index(("classes", str(m.classes))), ("label column", str(m.metadata["label"])))
    if m.metadata.get("weight") is not None:  # fedgrove train --weight: rows weighted by this column
        rows.insert(rows.index(("classes", str(m.classes))), ("weight column", str(m.metadata["weight"])))
    if m.metadata.get("weighted_by") is not None:  # a Federated Forest whose label holder weighed its rows
        rows.insert(rows.index(("classes", str(m.classes))), ("row weights", f"{m.metadata['weighted_by']}'s (the "
                                                                             f"label holder's)"))
    if m.metadata.get("class_weight") is not None:  # fedgrove train --class-weight
        rows.insert(rows.index(("classes", str(m.classes))) + 1, ("class weights", str(m.metadata["class_weight"])))
    for col, cats in (m.metadata.get("categories") or {}).items():  # predict encodes with these
        rows.append((f"categories of {col}", _categories_text(cats)))
    if "protocol" in m.metadata:
        held = f", {m.metadata['party']}'s copy" if m.metadata.get("party") else ""
        rows.append(("trained by", f"the {m.metadata['protocol']} protocol{held}"))
    if m.metadata.get("contributions"):
        rows.append(("contributions", contributions_text(m.metadata["contributions"])))
    if any(t.foreign_splits for t in m.trees):
        rows.append(("prediction", "through the federation: other parties hold some splits' thresholds"))
    gain, splits, labels = m.feature_importance("gain"), m.feature_importance("split"), m.feature_labels()
    rows.append(("top features by gain", _top_features(gain, labels)))
    if m.metadata.get("feature_owners"):
        rows.append(("gain by party", _gain_by_party(gain, m.metadata["feature_owners"])))
    t = RichTable(title=str(p), show_header=False)
    t.add_column("field")
    t.add_column("value")
    for k, v in rows:
        t.add_row(k, v)
    for k, v in sorted(m.params.items()):
        t.add_row(f"param {k}", str(v))
    out.print(t)
    if importance is not None:
        out.print(_importance_table(gain, splits, labels, importance))


@contextlib.contextmanager
def _damaged(p: Path, writer: str):
    """A file fedgrove wrote whose fields are not of the form it writes (damaged, or edited by hand) is named,
    where its report raised KeyError or TypeError; rich's table refuses a field that is not text the same way."""
    from rich.errors import NotRenderableError

    from fedgrove.exceptions import DataError, FedgroveError

    try:
        yield
    except (FedgroveError, UnicodeEncodeError):  # said already (some are ValueErrors too: InvalidParameterError);
        raise  # or the output's encoding, not the file, failed
    except (KeyError, TypeError, ValueError, AttributeError, NotRenderableError) as exc:
        raise DataError(f"{p} is damaged ({writer}): {type(exc).__name__}: {exc}") from None


def _checkpoint_info(p: Path) -> None:
    """What a party's checkpoint holds: whose it is, under which protocol, and how far the run had come."""
    from fedgrove.exceptions import DataError

    from fedgrove.runner.checkpoint import DIGEST, check_state_digest, whole_previous_state

    def damaged(message: str, what: str) -> DataError:  # (or what, and the state --resume takes instead)
        prev = whole_previous_state(p)
        return DataError(message if prev is None else f"checkpoint {p} {what}; --resume takes the state before it "
                         f"instead, {prev[0]} ({prev[1]} trees), which is whole")

    try:
        state = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged(f"checkpoint {p} cannot be read: {exc}", f"cannot be read ({exc})") from None
    if not isinstance(state, dict) or "trees_done" not in state:
        raise DataError(f"{p} is not a fedgrove checkpoint (no trees_done field)")
    digested = DIGEST in state
    try:
        state = check_state_digest(state, p)
    except DataError as exc:
        raise damaged(str(exc), "does not match the SHA-256 its run wrote with it (cut short by a crash, or "
                      "changed since)") from None
    run = state.get("run") if isinstance(state.get("run"), dict) else {}
    settings = run.get("settings") or {}
    from fedgrove.runner.config import shown_setting

    rows = [("checkpoint of", f"party {run.get('party', p.name.removesuffix('.checkpoint.json'))}"
             + (f", {run['role']}" if run.get("role") else "")),
            ("protocol", str(settings.get("federation.protocol") or state.get("protocol") or "unknown")),
            ("trees done", str(state["trees_done"]))]
    rows += [(k, str(shown_setting(settings[k])))
             for k in ("federation.seed", "params.max_depth", "params.learning_rate") if k in settings]
    if run.get("data_sha256"):
        rows.append(("data file SHA-256", run["data_sha256"][:16] + "..."))
    reads = {k: v for k, v in (run.get("reads") or {}).items() if v is not None}
    if reads:  # how the party read its data file, which a resumed run must read alike
        rows.append(("data read with", ", ".join(f"{k} {v!r}" for k, v in reads.items())))
    if not run:
        rows.append(("run", "not named (written before 2026-11-24): --resume cannot check it was this run's"))
    rows.append(("state", "matches the SHA-256 its run wrote with it" if digested else
                 "carries no SHA-256 of itself (written before 2026-11-26): edits to it cannot be told"))
    rows.append(("resume", "`fedgrove simulate CONFIG --resume` (or `fedgrove party CONFIG --resume` on every "
                           "party) continues from it, with the same settings and data; more n_estimators grow the "
                           "model on"))
    t = RichTable(title=str(p), show_header=False)
    t.add_column("field")
    t.add_column("value")
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)


def _stats_file(f: Path) -> tuple[str, dict] | None:
    """A party's ``<party>.stats.json`` as (its party, the statistics a run report shows), or None where the
    file is not one."""
    try:
        s = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    keys = ("role", "seconds", "total_sent", "total_received", "messages_sent", "rounds")
    if not isinstance(s, dict) or not all(k in s for k in keys):
        return None
    return str(s.get("party", f.name.split(".")[0])), s


def _partition_party(p: Path) -> dict | None:
    """The party whose training or test file ``p`` is, by the manifest of the partition beside it: its name,
    role, which file (training or test) and the label column when the file holds it; ``None`` otherwise."""
    from fedgrove.data.partition import MANIFEST, read_manifest

    if not (p.parent / MANIFEST).is_file():
        return None
    try:
        m = read_manifest(p.parent)
    except Exception:  # noqa: BLE001 - a broken manifest: the file is shown as any other
        return None
    for party in m.get("parties", []):
        for what, key in (("training", "file"), ("test", "test_file")):
            if party.get(key) == p.name:
                label = m.get("label") if party.get("has_label") else None  # if the file has the column
                weight = m.get("weight") if party.get("has_label") else None  # (fedgrove partition --weight)
                return {"name": party["name"], "role": party["role"], "what": what, "label": label, "weight": weight}
    return None


def _categories_text(cats: list) -> str:
    """A column's categories, the first 12 of them, in code order."""
    return listing(cats, 12)


def _host_importance(d: dict, p: Path) -> tuple:
    """A HybridTree host file's (gains, splits, labels, owners) per feature: the host's own over the splits of
    its layers, by name, then each guest's over the guest layers (the gains the host scored), ``guest0:3``."""
    from fedgrove.engine.model import feature_importance
    from fedgrove.exceptions import ModelFormatError
    from fedgrove.protocols.hybridtree.host import HybridHostModel

    try:
        model = HybridHostModel.from_dict(d)
    except ModelFormatError as exc:
        raise ModelFormatError(f"{p} is corrupt: {exc}") from None
    names = model.feature_names
    width = None if names is None else len(names)
    gain = feature_importance(model.host_trees, "gain", width)
    splits = feature_importance(model.host_trees, "split", width)
    labels = list(names) if width == len(gain) else [f"f{j}" for j in range(len(gain))]
    owners = ["host"] * len(gain)
    for u in sorted(model.guest_gains):
        gain = np.concatenate([gain, model.guest_gains[u]])
        splits = np.concatenate([splits, model.guest_splits[u]])
        labels += [f"{u}:{j}" for j in range(len(model.guest_gains[u]))]
        owners += [u] * len(model.guest_gains[u])
    return gain, splits, labels, owners


def _top_features(gain, labels, k: int = 5) -> str:
    """The ``k`` features with the largest summed gain, with their share of the total."""
    total = gain.sum()
    if not total > 0:
        return "none (no split has a gain)"
    top = [j for j in np.argsort(-gain, kind="stable")[:k] if gain[j] > 0]
    return ", ".join(f"{labels[j]} {100 * gain[j] / total:.1f}%" for j in top)


def _importance_table(gain, splits, labels, kind: str, what: str = "") -> RichTable:
    """Every feature split on, by ``kind`` importance, with the other kind beside it."""
    key = gain if kind == "gain" else splits
    used = [j for j in np.argsort(-key, kind="stable") if splits[j] > 0]
    t = RichTable(title=f"{what}features by {kind} ({len(used)} of {len(labels)} used)")
    for col in ("feature", "gain", "gain share", "splits"):
        t.add_column(col, justify="left" if col == "feature" else "right")
    total = gain.sum()
    for j in used:
        t.add_row(labels[j], f"{gain[j]:.6g}", f"{100 * gain[j] / total:.1f}%" if total > 0 else "-",
                  str(int(splits[j])))
    return t


def _gain_by_party(gain, owners) -> str:
    """Each feature owner's share of a federated model's summed gain (``owners``: (party, column) per feature)."""
    total = gain.sum()
    if len(owners) != len(gain) or not total > 0:
        return "unknown"
    shares = Counter()
    for (party, _), v in zip(owners, gain):
        shares[party] += v
    return ", ".join(f"{party} {100 * v / total:.1f}%" for party, v in shares.most_common())


def _federated_part(p: Path):
    """Rows describing a party's model file of a federated protocol (its own splits, or a HybridTree host's
    trees) and, for a host, its features' (gains, splits, labels) over its own layers; None for anything else."""
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(d, dict):
        return None
    if "party" in d and isinstance(d.get("splits"), list):
        trees = {s[0] for s in d["splits"] if isinstance(s, list) and s}
        cuts = d.get("bin_mapper", {}).get("cuts", [])
        rows = [("party", str(d["party"])), ("splits it owns", str(len(d["splits"]))),
                ("trees with its splits", str(len(trees))), ("its features", str(len(cuts)))]
        per_feature = Counter(s[2] for s in d["splits"] if isinstance(s, list) and len(s) > 2)
        if per_feature:
            labels = d.get("feature_names") or []
            rows.append(("its most used features", ", ".join(
                f"{labels[f] if isinstance(f, int) and 0 <= f < len(labels) else f'column {f}'} ({k} splits)"
                for f, k in per_feature.most_common(5))))
        return rows, None
    if d.get("format") == "fedgrove-hybridtree-host":
        guests = sorted({g for values in d.get("guest_values", []) if isinstance(values, dict) for g in values})
        kept = d.get("guest_children")
        if isinstance(kept, list):  # (node numbers, by which the host reads its guests' leaf ranks)
            n_kept = sum(len(k) for per_tree in kept if isinstance(per_tree, dict) for k in per_tree.values()
                         if isinstance(k, list))
            splits = f"{n_kept} (node numbers, without features or thresholds: the guests answer with leaf ranks)"
        else:
            splits = "none: a file from before 2026-12-07, whose guests answer with node numbers"
        return [("role", "HybridTree host"), ("objective", str(d.get("objective"))),
                ("trees", _trees_text(len(d.get("host_trees", [])), _classes_of(d.get("tree_class")))),
                ("guests with leaves", ", ".join(guests) or "none"),
                ("guests' splits it keeps", splits)], _host_importance(d, p)
    return None


def _trees_text(n: int, per_round: int) -> str:
    """A model's tree count; a multiclass model's with its rounds (one tree a class each), which is what
    ``n_estimators`` counts."""
    if per_round <= 1:
        return str(n)
    return f"{n} ({n // per_round} rounds of {per_round}, a tree a class)"


def _classes_of(tree_class) -> int:
    """Trees a round in a HybridTree host's file: one a class (``tree_class``: each tree's class)."""
    ok = isinstance(tree_class, list) and all(isinstance(c, int) for c in tree_class)
    return max(tree_class, default=0) + 1 if ok else 1


def _head(p: Path, n: int) -> bytes:
    with open(p, "rb") as fh:
        return fh.read(n)


def _model_features(m) -> str:
    """The model's feature count; for a vertical model, per party from its owners."""
    owners = m.metadata.get("feature_owners")
    if not owners:
        return str(m.n_features) if m.n_features is not None else "unknown"
    counts = Counter(party for party, _ in owners)
    return f"{len(owners)} (" + ", ".join(f"{p}: {k}" for p, k in counts.items()) + ")"


def _looks_like_model(p: Path) -> bool:
    if p.suffix.lower() != ".json":
        return False
    with open(p, "rb") as fh:
        head = fh.read(4096)
    try:
        return b'"format"' in head or json.loads(p.read_text(encoding="utf-8")) is not None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return True  # let the model loader report the corruption


def _run_stats(d: Path) -> dict:
    """The ``<party>.stats.json`` files the latest federation run wrote to its output directory, by party (in
    name order): the newest file names its federation's parties, and another run's files left in the directory
    (parties not among them) are left out, with a note."""
    runs, newest = {}, None
    for f in sorted(d.glob("*.stats.json")):
        if (one := _stats_file(f)) is not None:
            party, s = one
            runs[party] = s
            if newest is None or f.stat().st_mtime > newest[0]:
                newest = (f.stat().st_mtime, s.get("federation"))
    members = newest[1] if newest is not None else None
    if isinstance(members, list):
        stale = sorted(p for p in runs if p not in members)
        if stale:
            out.print(f"left out: the statistics of {', '.join(stale)}, from an earlier run in {d} with other "
                      f"parties")
        runs = {p: s for p, s in runs.items() if p in members}
    return runs
