"""``fedgrove simulate``, ``fedgrove party`` and ``fedgrove certs``."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from fedgrove.cli.common import check_output_dir, console, contributions_text, progress_bar


PREDICT_HELP = ("Only predict: every party loads its model file from the output directory and the federation "
                "predicts the configured test data (test = ... per party); the lead party writes the predictions")


def simulate(config: Path = typer.Argument(..., help="federation.toml: every party of the federation"),
             resume: bool = typer.Option(False, help="Continue from the parties' checkpoints"),
             predict: bool = typer.Option(False, "--predict", help=PREDICT_HELP)):
    """Run every party of a federation in this process (same protocol code as `fedgrove party`)."""
    from fedgrove.runner.config import load_federation
    from fedgrove.runner.run import simulate as run

    cfg = load_federation(config)
    _check_predict(cfg, predict, resume)
    check_output_dir(cfg.output_dir, f"[output] dir of {config}")
    what = "predicting with" if predict else "simulating"
    console.print(f"{what} a {cfg.protocol} federation of {len(cfg.parties)} parties ...")
    _note_missing_checkpoints(cfg, [p.name for p in cfg.parties], resume)
    with progress_bar("training", 1, enabled=not predict) as update:
        results = run(cfg, resume, update, predict_only=predict)
    _report(results, cfg.output_dir)


def party(config: Path = typer.Argument(..., help="party.toml: this party, its certificates and its peers"),
          resume: bool = typer.Option(False, help="Continue from this party's checkpoint (restart all parties so)"),
          predict: bool = typer.Option(False, "--predict", help=PREDICT_HELP)):
    """Run one party as its own process, talking to its peers over gRPC with mutual TLS."""
    from fedgrove.runner.config import load_party
    from fedgrove.runner.run import run_party

    cfg, me = load_party(config)
    _check_predict(cfg, predict, resume)
    check_output_dir(cfg.output_dir, f"[output] dir of {config}")
    _note_missing_checkpoints(cfg, [me.name], resume)
    with progress_bar(f"{me.name} training", 1, enabled=not predict) as update:
        results = run_party(cfg, me, resume, update, predict_only=predict)
    _report({me.name: results}, cfg.output_dir)


def _note_missing_checkpoints(cfg, names: list[str], resume: bool) -> None:
    """With --resume, say which parties have nothing to resume from (they start at the first tree)."""
    if not resume:
        return
    missing = [n for n in names if not (Path(cfg.output_dir) / f"{n}.checkpoint.json").exists()]
    if missing:
        console.print(f"note: no checkpoint of {', '.join(missing)} in {cfg.output_dir}: "
                      f"{'it starts' if len(missing) == 1 else 'they start'} from the first tree")


def _check_predict(cfg, predict: bool, resume: bool) -> None:
    from fedgrove.exceptions import InvalidParameterError
    from fedgrove.runner.config import NO_DATA

    if predict and resume:
        raise InvalidParameterError("--predict and --resume exclude each other")
    missing = [p.name for p in cfg.parties if p.role not in NO_DATA and p.test is None and p.data != Path("-")]
    if predict and missing:
        raise InvalidParameterError(f"--predict needs test data: give {', '.join(missing)} a test = ... file in "
                                    f"{cfg.source}")


def certs(
    parties: List[str] = typer.Argument(..., help="party names (one certificate each)"),
    out: Path = typer.Option(Path("certs"), "--out", "-o", help="directory for ca.pem, ca.key and <party>.pem/.key; "
                             "one that holds a CA already issues the new parties' certificates from it"),
    force: bool = typer.Option(False, "--force", help="issue a new key and certificate to every party given, "
                               "replacing those in --out"),
):
    """Create a federation CA and a certificate per party for mutual TLS."""
    from fedgrove.crypto.certs import create_federation_certs

    check_output_dir(out, "--out")
    files = create_federation_certs(out, parties, replace=force)
    if not files:
        console.print(f"{out} already holds valid certificates of {', '.join(parties)} from its CA; nothing to do "
                      f"(--force issues new ones)")
        return
    issued = [f.stem for f in files if f.suffix == ".pem" and f.name != "ca.pem"]
    kept = [p for p in parties if p not in issued]
    console.print(f"wrote {len(files)} files to {out}: certificates of {', '.join(issued)}"
                  + (" and a new CA" if out / "ca.pem" in files else " from the CA already there")
                  + (f" ({', '.join(kept)} already had valid ones)" if kept else "")
                  + "; keep ca.key offline, give each party ca.pem and its own <party>.pem/.key")


def _report(results: dict, out_dir) -> None:
    from rich.table import Table

    from fedgrove.cli.common import out

    t = Table(title=f"per-party communication (models and stats in {out_dir})")
    for col in ("party", "role", "seconds", "MB sent", "MB received", "messages sent", "rounds"):
        t.add_column(col)
    for name, s in results.items():
        t.add_row(name, s["role"], f"{s['seconds']:.1f}", f"{s['total_sent'] / 1e6:.2f}",
                  f"{s['total_received'] / 1e6:.2f}", str(s["messages_sent"]), str(s["rounds"]))
    out.print(t)
    warned = set()
    for s in results.values():  # FV-tree: every party saw the same endorsements; say it once
        refused = {q: n for q, n in (s.get("refused_uploads") or {}).items() if n}
        text = ", ".join(f"{q} {n} of {s['uploads_per_party']}" for q, n in refused.items())
        if refused and text not in warned:
            warned.add(text)
            out.print(f"warning: histogram uploads refused by the parties' endorsements: {text} (overlap distance "
                      f"above the threshold {s['threshold']:g}; honest parties with few instances per bin reach it "
                      f"too: use fewer bins ([params] max_bins), a higher [fvtree] threshold"
                      f"{', fewer [fvtree.dp] trees_per_ensemble' if s.get('privacy') else ''} or verify = false)")
    said = set()
    for name, s in results.items():
        text = contributions_text(s["contributions"]) if s.get("contributions") else None
        if text and text not in said:  # every FV-tree party holds the same; the horizontal aggregator alone
            said.add(text)
            kind = "contributions (split Shapley + voting)" if "total" in next(iter(s["contributions"].values())) \
                else "contributions (split Shapley)"
            out.print(f"{name}: {kind}: {text}")
        if s.get("privacy"):
            out.print(f"{name}: {s['privacy']}")
        if "ledger" in s:
            out.print(f"{name}: {s['ledger_records']} records in its ledger replica {s['ledger']}")
        if "predictions" in s:
            scores = scores_text(s)
            out.print(f"{name}: {s['n_test']} predictions in {s['predictions']}" + (f"  ({scores})" if scores else ""))
        elif "scored_from" in s:  # Federated Forest's label holder scores the master's predictions
            out.print(f"{name}: {scores_text(s)} on its {s['n_test']} test rows ({s['scored_from']}'s predictions)")


def scores_text(stats: dict) -> str:
    """``accuracy 0.9722  auc 0.9950`` from a party's statistics (empty without test metrics); an RMSE, in the
    labels' units, to six significant digits as ``fedgrove predict`` prints it (labels of 1e-9 had 0.0000)."""
    text = "  ".join(f"{k.removeprefix('test_')} {stats[k]:{'.6g' if k == 'test_rmse' else '.4f'}}"
                     for k in ("test_accuracy", "test_auc", "test_rmse") if k in stats)
    return text + (f", rows weighted by {stats['test_weight']!r}" if text and stats.get("test_weight") else "")
