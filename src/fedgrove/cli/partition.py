"""``fedgrove partition``: split a dataset into per-party files."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from fedgrove.cli.common import CATEGORICAL_HELP, categorical_option, check_output_dir, console, load_input, \
    options_named, report_categories
from fedgrove.data.io import infer_objective


class Scheme(str, Enum):
    horizontal = "horizontal"
    vertical = "vertical"
    hybrid = "hybrid"


def partition(
    ctx: typer.Context,
    data: str = typer.Argument(..., help="Data file or dataset:NAME"),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Directory for the party files and manifest.json"),
    scheme: Scheme = typer.Option(..., help="horizontal, vertical or hybrid"),
    parties: int = typer.Option(2, "--parties", "-p", help="Parties (horizontal/vertical) or guests (hybrid)"),
    label: Optional[str] = typer.Option(None, "--label", "-l", help="Label column (default: last column)"),
    weight: Optional[str] = typer.Option(None, "--weight", "-w", help="Column of row weights: kept beside the "
                                         "label in the files of the parties that hold it, not a feature"),
    mode: str = typer.Option("balanced", help="horizontal: balanced, unbalanced or dirichlet"),
    theta: float = typer.Option(0.8, help="horizontal unbalanced: SimFL's ratio"),
    beta: Optional[float] = typer.Option(None, help="Dirichlet concentration (horizontal dirichlet; "
                                         "hybrid label skew)"),
    hosts: int = typer.Option(1, help="hybrid: number of hosts"),
    overlap: float = typer.Option(0.0, help="hybrid: probability that a sample is also held by another guest"),
    drop_features: bool = typer.Option(False, help="hybrid: each guest drops a random number of its features"),
    file_format: str = typer.Option("csv", "--file-format", help="csv or parquet"),
    test_fraction: float = typer.Option(0.0, "--test-fraction", help="Hold out this fraction of the rows as a "
                                        "test set, written per party as <party>-test files (0: none)"),
    seed: int = typer.Option(0, help="Random seed"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write over files in --out that no earlier "
                                   "partition there wrote (an earlier partition's files are always replaced)"),
    fmt: Optional[str] = typer.Option(None, "--format", help="Input format: csv, parquet or libsvm"),
    categorical: Optional[str] = typer.Option(None, help=CATEGORICAL_HELP.replace(
        "kept in the model", "written to the party files, the categories to manifest.json")),
    protocol: Optional[str] = typer.Option(None, "--protocol", help="Also write federation.toml, a config that "
                                           "`fedgrove simulate` runs on these files: vertical or federated-forest "
                                           "(vertical scheme), horizontal, simfl or fvtree (horizontal), hybridtree "
                                           "(hybrid, one host)"),
):
    """Simulate a federation: one file per party, with instance IDs, plus a manifest."""
    from fedgrove.data.partition import (MANIFEST, file_names, hold_out, horizontal_partition, hybrid_partition,
                                         label_mix, read_manifest, refuse_empty, vertical_partition,
                                         write_partition, write_test_files)
    from fedgrove.exceptions import DataError, InvalidParameterError

    _refuse_options_unused(ctx, scheme.value, mode)
    if protocol is not None and protocol not in FOR_SCHEME[scheme.value]:
        raise InvalidParameterError(f"--protocol {protocol!r} does not run on a {scheme.value} partition; "
                                    f"expected {' or '.join(FOR_SCHEME[scheme.value])}")
    if weight is not None and protocol not in (None, *WEIGHTED):
        raise InvalidParameterError(f"--weight {weight!r}: the {protocol} protocol takes no row weights; the "
                                    f"{', '.join(WEIGHTED)} protocols do (their label holders')")
    if protocol is not None and hosts > 1:
        raise InvalidParameterError(f"--protocol writes one federation's config, and --hosts {hosts} makes "
                                    f"{hosts} federations (one per host): leave --protocol out and write a config "
                                    f"per host")
    if file_format not in ("csv", "parquet"):  # before reading the data, which may take a while
        raise InvalidParameterError(f"--file-format (the party files' format) must be csv or parquet, got "
                                    f"{file_format!r}")
    check_output_dir(out_dir, "--out")
    if seed < 0:
        raise InvalidParameterError(f"--seed must be >= 0, got {seed}")
    try:
        table = load_input(data, label if label is not None else -1, fmt,
                           categorical=categorical_option(categorical))
    except DataError as exc:
        if fmt is not None and not data.startswith("dataset:") and fmt != _format_of(data):
            raise type(exc)(f"{exc} (--format names the format of the data you give; the party files' format "
                            f"is --file-format)") from None
        raise
    if table.y is None:
        raise DataError("the data has no label column; pass --label")
    report_categories(table)
    if weight is not None:
        from fedgrove.data.io import take_weights

        table = take_weights(table, weight, repr(data))
    test = None
    with options_named(PARTITION_OPTIONS):
        if test_fraction:
            if not 0.0 < test_fraction < 1.0:  # (hold_out's own message left out the 0 this option takes)
                raise InvalidParameterError(f"--test-fraction must be in (0, 1) (the rows held out as a test set) "
                                            f"or 0 (none), got {test_fraction!r}")
            table, test = hold_out(table, test_fraction, seed)
        if scheme == Scheme.horizontal:
            p = horizontal_partition(table.y, parties, mode, theta=theta, beta=beta if beta is not None else 0.5,
                                     seed=seed)
        elif scheme == Scheme.vertical:
            p = vertical_partition(table.n_samples, table.n_features, parties, seed)
        else:
            p = hybrid_partition(table.y, table.n_features, n_guests=parties, n_hosts=hosts, seed=seed, beta=beta,
                                 overlap=overlap, drop_features=drop_features)
            guests = [s for s in p.shards if s.role == "guest"]  # the library keeps them (the paper's Figure 8
            # runs without them); a party file without rows cannot take part in a federation
            refuse_empty([s.rows for s in guests], [s.name for s in guests], p.n_samples, "n_guests",
                         beta is not None, "guests")
    _replace_earlier_partition(out_dir, file_names(p, file_format, test=test is not None)
                               + ([CONFIG] if protocol is not None else []), overwrite)
    write_partition(p, table, out_dir, file_format)
    test_files = write_test_files(p, test, out_dir, file_format, seed) if test is not None else []
    manifest = read_manifest(out_dir)
    lead = LEAD.get(protocol)
    w = max(8, len(lead or ""), *(len(s.name) for s in p.shards))
    if lead:  # the roles the config gives, and the party it adds
        console.print(f"  {lead:<{w}} {lead:<{w}} {'no data':>16}  (in the config only: it coordinates the clients)")
    for s, entry in zip(p.shards, manifest["parties"]):
        feats = table.n_features if scheme == Scheme.horizontal else len(s.features)
        mix = f" ({label_mix(entry['label_counts'])})" if "label_counts" in entry else ""
        held = "  + label" + ("" if weight is None else " and weights")
        console.print(f"  {s.name:<{w}} {'client' if lead else s.role:<{w}} {len(s.rows):>8} samples  {feats:>4} "
                      f"features{held + mix if s.has_label else ''}")
    held_out = "" if test is None else (f", {len(test_files)} test file{'s' if len(test_files) > 1 else ''} "
                                        f"({test.n_samples} test rows held out)")
    console.print(f"wrote {len(p.shards)} party files{held_out} and manifest.json to {out_dir}; the label column "
                  f"is {table.label_column!r} (label = \"{table.label_column}\" in a labelled party's config)")
    y = np.asarray(table.y)
    _note_classes(y, manifest, protocol is not None)
    if protocol is not None:
        from fedgrove.engine.model import atomic_write_text

        config = out_dir / CONFIG
        atomic_write_text(config, federation_config(protocol, out_dir, manifest, y))
        manifest["config"] = CONFIG  # a later partition here removes the config with the files
        atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=2))
        console.print(f"wrote {config}: `fedgrove simulate {config}` runs it")


#: the protocols whose label holders take row weights (``--weight``)
WEIGHTED = ("horizontal", "vertical", "hybridtree", "federated-forest", "simfl")
#: the federation config ``--protocol`` writes beside the party files
CONFIG = "federation.toml"
#: the party without data that a protocol's config adds (its data parties are then "client"s)
LEAD = {"horizontal": "aggregator", "federated-forest": "master"}
#: the protocols that run on each partition scheme
FOR_SCHEME = {"vertical": ("vertical", "federated-forest"), "horizontal": ("horizontal", "simfl", "fvtree"),
              "hybrid": ("hybridtree",)}


#: the partition functions' parameters as the command's options (their errors name the option)
PARTITION_OPTIONS = {"n_parties": "--parties", "n_guests": "--parties", "n_hosts": "--hosts", "theta": "--theta",
                     "beta": "--beta", "overlap": "--overlap", "fraction": "--test-fraction",
                     "seed": "--seed"}

#: the options that only some partitions read: where each applies (scheme, and horizontal mode where it matters)
SCHEME_OPTIONS = {"mode": ("--mode", {("horizontal", None)}),
                  "theta": ("--theta", {("horizontal", "unbalanced")}),
                  "beta": ("--beta", {("horizontal", "dirichlet"), ("hybrid", None)}),
                  "hosts": ("--hosts", {("hybrid", None)}),
                  "overlap": ("--overlap", {("hybrid", None)}),
                  "drop_features": ("--drop-features", {("hybrid", None)})}


def _refuse_options_unused(ctx: typer.Context, scheme: str, mode: str) -> None:
    """Refuse an option given on the command line that this partition does not read (``--scheme vertical
    --theta 0.3`` wrote the vertical partition as if the option were not there)."""
    from fedgrove.exceptions import InvalidParameterError

    for name, (flag, where) in SCHEME_OPTIONS.items():
        source = ctx.get_parameter_source(name)  # click's enum, or typer's copy of it (typer >= 0.22 vendors click)
        if source is None or source.name != "COMMANDLINE":
            continue
        if (scheme, None) in where or (scheme == "horizontal" and (scheme, mode) in where):
            continue
        places = " or ".join(f"--scheme {s}" + (f" --mode {m}" if m else "") for s, m in sorted(where))
        raise InvalidParameterError(f"{flag} applies to {places}, not to this partition (--scheme {scheme}"
                                    f"{' --mode ' + mode if scheme == 'horizontal' else ''}): leave it out")


def _class_codes(y: np.ndarray) -> np.ndarray | None:
    """The classes, when the labels are a classification's and already its codes 0, 1, ...; else ``None``."""
    if y.dtype.kind not in "fiub" or infer_objective(y) == "regression":
        return None
    values = np.unique(y)
    return values if np.array_equal(values, np.arange(len(values))) else None


def _needs_class_list(y: np.ndarray) -> bool:
    """Class names, or numeric classes other than the codes (LIBSVM's -1 and 1): a federation lists them."""
    return infer_objective(y) != "regression" and _class_codes(y) is None


def federation_config(protocol: str, out_dir: Path, manifest: dict, y: np.ndarray) -> str:
    """A federation config for ``fedgrove simulate`` on the partition written to ``out_dir`` (its files named
    relative to the config, which goes there too; ``manifest``: the partition's): the parties and their roles,
    data, label and test files, and what the labels ``y`` need (the objective, the class list or the number of
    classes); a few trees."""
    from fedgrove.runner.config import classes_setting

    m = manifest
    objective = infer_objective(y)
    fed = [f'protocol = "{protocol}"', "seed = 0", "timeout = 120"]
    if _needs_class_list(y):
        fed.append(classes_setting(y).removeprefix("[federation] "))
    if protocol == "federated-forest":
        params = [f'task = "{"regression" if objective == "regression" else "classification"}"',
                  "n_estimators = 20", "max_depth = 6"]
    elif protocol == "hybridtree":  # its depth is the host's layers and the guests'
        params = [f'objective = "{objective}"', "n_estimators = 20", "learning_rate = 0.3"]
    else:
        params = [f'objective = "{objective}"', "n_estimators = 20", "max_depth = 4", "learning_rate = 0.3"]
        codes = _class_codes(y)
        if objective == "multiclass" and codes is not None and protocol in FOR_SCHEME["horizontal"]:
            params.append(f"n_classes = {len(codes)}  # a party may lack some classes")
    tables = ""
    if protocol == "fvtree" and min(e["n_samples"] for e in m["parties"]) < 2000:
        # honest parties with few instances per bin stay apart in the endorsement's overlap distance
        params.append("max_bins = 8  # few rows per party: few bins (examples/fvtree/README.md)")
        tables = "[fvtree]\nthreshold = 1.0  # the endorsement's overlap distance; 0.75 by default\n\n"
    if protocol == "hybridtree":
        tables = ("[hybridtree]\nhost_depth = 2\nguest_depth = 2  # trees of depth 4: 2 layers on the host's "
                  "features, 2 on the guests'\n\n")
    lead = LEAD.get(protocol)
    blocks = [f'[[party]]\nname = "{lead}"\nrole = "{lead}"'] if lead else []
    for entry in m["parties"]:
        # file names and the label column as TOML basic strings: a column name may hold quotes
        lines = [f'name = "{entry["name"]}"', f'role = "{"client" if lead else entry["role"]}"',
                 f'data = {json.dumps(entry["file"])}']
        if entry["has_label"]:
            lines.append(f'label = {json.dumps(m["label"])}')
            if m.get("weight"):
                lines.append(f'weight = {json.dumps(m["weight"])}')
        test = entry.get("test_file") or m.get("test_file")
        if test:
            lines.append(f'test = {json.dumps(test)}')
        blocks.append("[[party]]\n" + "\n".join(lines))
    return (f"# {protocol} on the partition in this folder ({m['scheme']}), written by `fedgrove partition "
            f"--protocol {protocol}`:\n#   fedgrove simulate {out_dir / CONFIG}\n"
            f"# every table's keys, with their defaults: docs/cli.md, 'Configuration reference'\n"
            "[federation]\n" + "\n".join(fed) + "\n\n" + tables + "[params]\n" + "\n".join(params) + "\n\n"
            + "\n\n".join(blocks) + '\n\n[output]\ndir = "runs"\n')


def _note_classes(y: np.ndarray, manifest: dict, config_written: bool = False) -> None:
    """Labels that are not class codes (names, or numbers such as LIBSVM's -1 and 1): the class list a
    federation's configs must give.  Codes of more than two classes split by samples: the number of classes,
    which a party lacking some cannot tell.  ``config_written``: the federation.toml written with the partition
    gives it (it is said so)."""
    from fedgrove.runner.config import classes_setting

    given = f" ({CONFIG}, written below, gives it)" if config_written else ""
    if _needs_class_list(y):
        what = ("the labels are class names:" if y.dtype.kind not in "fiub" else
                "the labels are not the class codes 0, 1, ...: for classification,")
        console.print(f"{what} a federation on these files needs, in every party's config, {classes_setting(y)} "
                      f"(the order gives the codes 0, 1, ...){given}")
        return
    codes = _class_codes(y)
    if codes is not None and len(codes) > 2 and manifest["scheme"] == "horizontal":
        held = [f"{e['name']} {sum(n > 0 for n in e['label_counts'].values())}" for e in manifest["parties"]]
        console.print(f"the labels are the codes of {len(codes)} classes: a multiclass federation on these files "
                      f"needs, in every party's config, [params] n_classes = {len(codes)} (a party may lack some "
                      f"classes; classes held: {', '.join(held)}){given}")


def _replace_earlier_partition(out_dir: Path, names: list[str], overwrite: bool) -> None:
    """Remove the files of a partition written to ``out_dir`` before (those its manifest names), so that none of
    them is left beside the new one (a 3-party partition followed by a 2-party one kept party2's file, with
    features the new parties also hold); refuse to write over any other file unless ``overwrite``."""
    from fedgrove.data.partition import MANIFEST, read_manifest
    from fedgrove.exceptions import InvalidParameterError

    earlier = []
    if (out_dir / MANIFEST).is_file():
        m = read_manifest(out_dir, check=False)
        if not isinstance(m, dict) or not isinstance(m.get("parties", []), list):
            raise InvalidParameterError(f"{out_dir / MANIFEST} exists but is not a partition's manifest; give "
                                        f"another --out")
        earlier = [e.get(k) for e in m.get("parties", []) if isinstance(e, dict) for k in ("file", "test_file")]
        earlier = [n for n in earlier + [m.get("test_file"), m.get("config")]
                   if isinstance(n, str) and Path(n).name == n and (out_dir / n).is_file()]
    clash = [n for n in names if (out_dir / n).exists() and n not in earlier]
    if clash and not overwrite:
        raise InvalidParameterError(f"{out_dir} holds {', '.join(clash[:5])}{' ...' if len(clash) > 5 else ''}, "
                                    f"which this partition would write over: give another --out, or --overwrite")
    for n in earlier:
        (out_dir / n).unlink()
    if earlier:
        console.print(f"replaced the partition that was in {out_dir} ({len(earlier)} files)")


def _format_of(path: str) -> str | None:
    """The format a file's extension names, if any."""
    from fedgrove.data.io import detect_format
    from fedgrove.exceptions import DataError

    try:
        return detect_format(path)
    except DataError:
        return None
