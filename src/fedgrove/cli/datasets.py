"""``fedgrove datasets list|download``: the papers' named datasets, where they are found, fetching missing ones."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fedgrove.cli.common import check_output_dir, console, listed, out

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="List the named datasets (dataset:NAME) and download missing ones with a checksum check.")


@listed(app, "list")
def list_(directory: Optional[Path] = typer.Option(None, "--dir", help="Data directory (default: FEDGROVE_DATA_DIR, "
                                                                       "../shared/data or ~/.cache/fedgrove/data)")):
    """Each named dataset's files: where they were found, or where to get them."""
    from fedgrove.data import datasets as ds

    root = Path(directory) if directory is not None else ds.data_dir()
    out.print(f"data directory: {root}")
    for name in ds.available_datasets():
        for f in ds.dataset_remote_files(name):
            path = ds.find_file(root / name, f)
            if path is not None:
                status = f"found: {path.relative_to(root)}"
            elif f.url is not None:
                status = f"missing: `fedgrove datasets download {name}` fetches {f.url}"
            else:
                status = f"missing: no direct download, get it from {ds.dataset_homepage(name)}"
            out.print(f"  {name:<11} {f.name:<23} {status}")


@listed(app)
def download(names: List[str] = typer.Argument(..., help="Dataset names (see `fedgrove datasets list`)"),
             directory: Optional[Path] = typer.Option(None, "--dir", help="Data directory (default: as `list`)"),
             base_url: Optional[str] = typer.Option(None, "--base-url",
                                                    help="Fetch from this mirror (URL + file name) instead of the "
                                                         "official sources; the checksums are the same")):
    """Fetch the missing files of the named datasets; a file is kept only when its SHA-256 matches the
    published file's."""
    from fedgrove.data import datasets as ds
    from fedgrove.exceptions import DataError

    root = Path(directory) if directory is not None else ds.data_dir()
    unknown = [n for n in names if n not in ds.available_datasets()]
    if unknown:
        raise DataError(f"unknown dataset(s) {', '.join(map(repr, unknown))}; available: "
                        f"{', '.join(ds.available_datasets())}")
    for name in names:
        for f in ds.dataset_remote_files(name):
            there = ds.find_file(root / name, f)
            if there is not None:
                out.print(f"{name}: {there} is already there")
                continue
            check_output_dir(root, "--dir")  # only when something is to be written
            with console.status(f"downloading {name}/{f.name} ..."):
                path = ds.fetch_file(name, f, root / name, base_url)
            out.print(f"{name}: downloaded {path} (sha256 checked)")
