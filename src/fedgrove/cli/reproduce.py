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
    return items


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
):
    """Rerun a paper's experiments; writes report.md, results.json and PNG plots."""
    if paper not in PAPERS:
        raise InvalidParameterError(f"paper must be one of {', '.join(PAPERS)}, got {paper!r}")
    if he not in ("plain", "ou", "paillier"):
        raise InvalidParameterError(f"--he must be plain, ou or paillier, got {he!r}")
    import importlib

    exp = importlib.import_module(PAPERS[paper])
    ds = _split(datasets, exp.DATASETS, "--datasets")
    ex = _split(experiments, exp.EXPERIMENTS, "--experiments")
    out = out or Path("results") / paper
    check_output_dir(out, "--out")
    with progress_bar(f"reproduce {paper}", len(ds) * len(ex) + 1, not no_progress) as update:
        def step(done, total, what):
            update(done, total)
            console.print(f"[dim]{escape(what)}[/dim]", markup=True)
        exp.reproduce(out, datasets=ds, experiments=ex, quick=quick, progress=step, he=he, seed=seed)
    console.print(f"report written to {out / 'report.md'}")
