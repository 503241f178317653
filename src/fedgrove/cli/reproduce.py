"""``fedgrove reproduce PAPER``: rerun a paper's experiments and write a report beside its numbers."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from fedgrove.cli.common import check_output_dir, console, progress_bar
from fedgrove.exceptions import InvalidParameterError

PAPERS = {"hybridtree": "fedgrove.experiments.hybridtree", "federated-forest": "fedgrove.experiments.forest",
          "simfl": "fedgrove.experiments.simfl", "fvtree": "fedgrove.experiments.fvtree"}


def _split(value: str | None, allowed: tuple, what: str) -> list[str]:
    if value is None:
        return list(allowed)
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise InvalidParameterError(f"{what} must be a comma-separated subset of {', '.join(allowed)}; got "
                                    f"{value!r}")
    return list(dict.fromkeys(items))  # each once: a repeated experiment ran twice


def reproduce(
    paper: str = typer.Argument(..., help=f"Which paper: {', '.join(PAPERS)}"),
    out: Path = typer.Option(None, "--out", "-o", help="Results folder [default: results/PAPER]"),
    quick: bool = typer.Option(False, "--quick", help="Subsampled data and fewer trees (minutes, for CI); "
                                                      "not comparable with the paper"),
    datasets: str = typer.Option(None, "--datasets", help="Comma-separated datasets [default: all of the paper's]"),
    experiments: str = typer.Option(None, "--experiments", help="Comma-separated experiments [default: all]"),
    he: str = typer.Option("plain", "--he", help="HE for the accuracy runs: plain, ou or paillier (the protocols "
                                                 "are lossless, so accuracy does not depend on it; for "
                                                 "federated-forest plain means the paper's shared labels)"),
    seed: int = typer.Option(0, "--seed", help="Seed of the data split and of every randomised step"),
    no_progress: bool = typer.Option(False, "--no-progress", help="Do not draw a progress bar"),
    merge: bool = typer.Option(False, "--merge", help="Add this run's experiments to the results already in the "
                               "folder (same settings), replacing only those, and rewrite the report from all"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the results already in the folder"),
):
    """Rerun a paper's experiments; writes report.md, results.json and PNG plots."""
    if paper not in PAPERS:
        raise InvalidParameterError(f"paper must be one of {', '.join(PAPERS)}, got {paper!r}")
    if he not in ("plain", "ou", "paillier"):
        raise InvalidParameterError(f"--he must be plain, ou or paillier, got {he!r}")
    if seed < 0:  # numpy's generators take none below 0: it failed mid-run with a traceback
        raise InvalidParameterError(f"--seed must be >= 0, got {seed}")
    import importlib

    exp = importlib.import_module(PAPERS[paper])
    per_dataset = getattr(exp, "PER_DATASET", ())  # results laid out by experiment: those keyed by dataset
    ds = _split(datasets, exp.DATASETS, "--datasets")
    ex = _split(experiments, exp.EXPERIMENTS, "--experiments")
    out = out or Path("results") / paper
    check_output_dir(out, "--out")
    if merge and overwrite:
        raise InvalidParameterError("--merge and --overwrite exclude each other")
    earlier = _earlier_results(out)
    if earlier is not None and not (merge or overwrite):
        raise InvalidParameterError(
            f"{out} holds the results of an earlier run ({_describe(earlier, per_dataset)}), which this run would "
            f"replace: give another --out, add this run's experiments to them with --merge, or replace them with "
            f"--overwrite")
    merge = merge and earlier is not None
    if merge:  # the settings the command line gives, checked before any work (all of them after the run)
        _check_same_settings(earlier.get("config", {}), {"quick": quick, "seed": seed})
    from fedgrove.data.datasets import available_datasets, dataset_files

    for name in ds:  # every dataset's files are there before any work or any folder is made
        if name in available_datasets():
            dataset_files(name)

    def run(run_dir: Path) -> dict:
        with progress_bar(f"reproduce {paper}", len(ds) * len(ex) + 1, not no_progress) as update:
            def step(done, total, what):
                update(done, total)
                console.print(f"[dim]{escape(what)}[/dim]", markup=True)
            return exp.reproduce(run_dir, datasets=ds, experiments=ex, quick=quick, progress=step, he=he, seed=seed)

    if merge:  # run beside the earlier results, then put this run's experiments into them
        import tempfile

        from fedgrove.experiments.report import write_json

        with tempfile.TemporaryDirectory(prefix=".reproduce-", dir=out) as tmp:
            results = run(Path(tmp))
        merged = merge_results(earlier, results, _what_ran(results, ex, ds), per_dataset)
        write_json(out / "results.json", merged)
        exp.write_report(merged, out)
    else:
        run(out)
    console.print(f"report written to {out / 'report.md'}" + (" (merged with the earlier results)" if merge else ""))


def _what_ran(results: dict, experiments: list[str], datasets: list[str]) -> str:
    """What a run computed, for the merge's note: its experiments on its datasets; for results laid out by
    experiment (Federated Forest's, whose experiments but Table 1 take their datasets from the settings), each
    experiment on the datasets its steps name."""
    steps = results.get("seconds")
    if "datasets" in results or not isinstance(steps, dict) or not steps:
        return f"{', '.join(experiments)} on {', '.join(datasets)}"
    ran: dict[str, list[str]] = {}
    for step in steps:  # "experiment:dataset"
        name, _, data = str(step).partition(":")
        ran.setdefault(name, []).append(data)
    return "; ".join(f"{name} on {', '.join(data)}" for name, data in ran.items())


def _earlier_results(out: Path) -> dict | None:
    path = out / "results.json"
    if not path.exists():
        return None
    import json

    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidParameterError(f"{path} exists but cannot be read ({exc}); move it away or use --overwrite") \
            from None
    return d if isinstance(d, dict) else {}


def _describe(results: dict, per_dataset: tuple = ()) -> str:
    quick = " (--quick)" if results.get("config", {}).get("quick") else ""
    date = results.get("machine", {}).get("date", "undated")
    parts = [f"{name}: {', '.join(k for k in r if k not in ('n_train', 'n_test', 'n_features', 'seconds'))}"
             for name, r in results.get("datasets", {}).items() if isinstance(r, dict)]
    # results laid out by experiment (Federated Forest's), where the experiments keyed by dataset name them
    parts += [f"{key}: {', '.join(value)}" if key in per_dataset and isinstance(value, dict) else key
              for key, value in results.items() if key not in ("config", "machine", "datasets", "seconds", "reruns")]
    return f"{date}{quick}; " + ("; ".join(parts) or "no experiments")


def _check_same_settings(earlier: dict, now: dict, every: bool = False) -> None:
    """Refuse a merge whose settings ``now`` differ from the earlier run's (only those ``now`` names and the
    earlier config has, unless ``every``)."""
    keys = set(earlier) | set(now) if every else set(now) & set(earlier)
    differ = sorted(k for k in keys if earlier.get(k) != now.get(k))
    if differ:
        shown = "; ".join(f"{k}: {earlier.get(k)!r} there, {now.get(k)!r} here" for k in differ[:5])
        raise InvalidParameterError(f"--merge needs the earlier run's settings, and these differ ({shown}); give "
                                    f"another --out or use --overwrite")


def merge_results(earlier: dict, new: dict, what: str, per_dataset: tuple = ()) -> dict:
    """``earlier`` with the entries ``new`` computed put in (per dataset: each result key replaced, step seconds
    added); refused when the two runs' settings differ.  The machine note records the merge.

    Results laid out by experiment rather than by dataset (Federated Forest's): each experiment's entry
    replaced, or, for the experiments ``per_dataset`` names (keyed by dataset), each dataset's; step seconds
    added."""
    import json

    def plain(d):
        return json.loads(json.dumps(d, default=str))

    _check_same_settings(plain(earlier.get("config", {})), plain(new.get("config", {})), every=True)
    merged = plain(earlier)
    new = plain(new)
    for name, r in new.get("datasets", {}).items():
        target = merged.setdefault("datasets", {}).setdefault(name, {})
        for key, value in r.items():
            if key == "seconds" and isinstance(target.get("seconds"), dict):
                target["seconds"].update(value)
            else:
                target[key] = value
    for key, value in new.items():  # (until 2026-11-26 these were left out, though the note said merged)
        if key in ("config", "machine", "datasets"):
            continue
        if (key == "seconds" or key in per_dataset) and isinstance(merged.get(key), dict) \
                and isinstance(value, dict):
            merged[key].update(value)
        else:
            merged[key] = value
    machine = merged.setdefault("machine", {})
    note = f"{what}: {new.get('machine', {}).get('date', 'undated')} (merged with --merge)"
    machine["note"] = f"{machine['note']}; {note}" if machine.get("note") else \
        f"{machine.get('date', 'undated')}: the rest; {note}"
    return merged
