"""Helpers shared by the ``fedgrove reproduce`` experiments: markdown tables, plots, result files."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np

from fedgrove.engine.model import atomic_write_text


def fmt(v, digits: int = 3) -> str:
    """A cell: floats to ``digits`` places, (lo, hi) pairs as ``lo-hi``, None as a dash."""
    if v is None:
        return "-"
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return f"{fmt(v[0], digits)}-{fmt(v[1], digits)}"
    if isinstance(v, (float, np.floating)):
        return f"{v:.{digits}f}"
    return str(v)


def md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in r) + " |" for r in rows]
    return "\n".join(lines)


def machine() -> dict:
    import os

    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def runs_note(results: dict) -> list[str]:
    """A report's lines saying when each part of results merged from several runs was run (the machine's note,
    which ``fedgrove reproduce --merge`` extends), and which experiments were rerun to check them (``reruns``:
    each with its experiments, machine and note); none for the results of one run."""
    parts = [f"Runs: {results['machine']['note']}."] if results.get("machine", {}).get("note") else []
    for r in results.get("reruns", []):
        why = r.get("note") or r.get("why")
        parts.append(f"Rerun {r.get('machine', {}).get('date', 'undated')}: {', '.join(r.get('experiments', []))}"
                     + (f" ({why})." if why else "."))
    return [" ".join(parts), ""] if parts else []


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, default=_default))


def _default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot write {type(o).__name__} to JSON")


def line_plot(path: Path, title: str, xlabel: str, ylabel: str, x, series: dict, bands: dict | None = None) -> None:
    """``series``: label -> y values; ``bands``: label -> (lo, hi) values drawn as a shaded range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6), dpi=120)
    for label, ys in series.items():
        ax.plot(x, ys, marker="o", label=label)
    for label, (lo, hi) in (bands or {}).items():
        line, = ax.plot(x, (np.asarray(lo) + np.asarray(hi)) / 2, marker="s", linestyle="--", label=label)
        ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color())
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    """Lay out, write to a temporary file, close, then rename into place (no half-written PNG)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = Path(path).with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def run_steps(out_dir, cfg, quick: bool, datasets, experiments, load, run, report, progress=None) -> dict:
    """The loop of a paper's ``reproduce``: for each dataset and experiment, ``run(name, exp, r, data)`` fills
    the dataset's results ``r`` from ``data = load(name)`` (X, y, X_test, y_test); the step's seconds go to
    ``r["seconds"]``, ``results.json`` is rewritten after every step, ``report(results, out_dir)`` ends."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"config": vars(cfg) | {"quick": quick}, "machine": machine(), "datasets": {}}
    steps = [(d, e) for d in datasets for e in experiments]
    for i, (name, exp) in enumerate(steps):
        if progress:
            progress(i, len(steps), f"{name}: {exp}")
        data = load(name)
        X, y, _, yt = data
        r = results["datasets"].setdefault(name, {"n_train": len(y), "n_test": len(yt), "n_features": X.shape[1]})
        t = time.perf_counter()
        run(name, exp, r, data)
        r.setdefault("seconds", {})[exp] = time.perf_counter() - t
        write_json(out_dir / "results.json", results)
    if progress:
        progress(len(steps), len(steps), "report")
    report(results, out_dir)
    return results
