"""PNG plots for the benchmark results (matplotlib, optional: without it no plot is written, and
the summary says so)."""
from __future__ import annotations

import os

from bench.common import out_dir


def line_plot(name: str, title: str, xlabel: str, ylabel: str, xs, series: dict, logx: bool = False,
              quick: bool = False) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for label, ys in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(out_dir(quick), exist_ok=True)
    path = os.path.join(out_dir(quick), f"{name}.png")
    fig.savefig(path)
    plt.close(fig)
    return path
