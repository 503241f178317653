"""``fedgrove ledger verify|show``: check an FGBDT-Chain ledger file, summarise who contributed what."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fedgrove.cli.common import check_output_file, console, listed, out

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Check an FGBDT-Chain ledger (SQLite) and summarise the parties' contributions.")


@listed(app)
def verify(ledgers: List[Path] = typer.Argument(..., help="A party's ledger file (<party>.ledger.sqlite); "
                                               "several: the parties' replicas, which must also agree")):
    """Check every hash and signature and recompute every contribution; with several replicas, check that they
    hold the same records (one file alone cannot show records cut from its end).  Exit 8 naming the first bad
    record."""
    from fedgrove.ledger.verify import compare_replicas, verify_ledger

    for ledger in ledgers:
        s = verify_ledger(ledger)
        kinds = ", ".join(f"{n} {k}" for k, n in s.kinds.items())
        out.print(f"{ledger}: {s.n_records} records verified ({kinds}); head {s.head.hex()[:16]}")
    if len(ledgers) > 1:
        compare_replicas(ledgers)
        out.print(f"the {len(ledgers)} replicas hold the same records")


@listed(app)
def show(ledger: Path = typer.Argument(..., help="A party's ledger file (<party>.ledger.sqlite)"),
         png: Optional[Path] = typer.Option(None, "--png", help="Also draw the contributions as a bar chart here")):
    """Verify the ledger, then print each party's contributions (split Shapley, voting, total) and uploads."""
    from rich.table import Table

    from fedgrove.ledger.verify import verify_ledger

    check_output_file(png, "--png")
    s = verify_ledger(ledger)
    total = sum(c["total"] for c in s.contributions.values()) or 1.0
    t = Table(title=f"contributions recorded in {ledger} (beta = {s.beta:g})")
    for col in ("party", "split Shapley", "voting", "total", "share", "uploads accepted", "uploads refused"):
        t.add_column(col)
    for q in s.parties:
        c, u = s.contributions[q], s.uploads[q]
        t.add_row(q, f"{c['shapley']:.4g}", f"{c['vote']:.4g}", f"{c['total']:.4g}", f"{100 * c['total'] / total:.1f}%",
                  str(u["accepted"]), str(u["refused"]))
    out.print(t)
    if png is not None:
        _bar_chart(png, s)
        console.print(f"wrote {png}")


def _bar_chart(path: Path, s) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from fedgrove.experiments.report import save_figure

    parties = s.parties
    x = np.arange(len(parties))
    shap = [s.contributions[q]["shapley"] for q in parties]
    vote = [s.beta * s.contributions[q]["vote"] for q in parties]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(parties)), 3.4), dpi=120)
    ax.bar(x, shap, label="split Shapley")
    ax.bar(x, vote, bottom=shap, label=f"voting (x{s.beta:g})")
    ax.set_xticks(x, parties)
    ax.set_ylabel("contribution (sum of split gains)")
    ax.set_title("FGBDT-Chain contributions")
    ax.legend(fontsize=8)
    save_figure(fig, path)
