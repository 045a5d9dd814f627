"""The LR finder's plot, drawn with matplotlib's Agg canvas (a file, never a display).

A ``Figure`` with its own ``FigureCanvasAgg`` is used instead of ``pyplot``: pyplot keeps global
state and picks a GUI backend from the environment; this touches neither, so the plot can be made
inside any program (a notebook, a process without a display) without changing its backend.
"""

from __future__ import annotations

from pathlib import Path


def plot_lr_curve(path: Path, lrs: list[float], losses: list[float], smoothed: list[float],
                  suggestion: float | None, configured: float) -> None:
    """Write a PNG of the loss against the learning rate (log x axis): the raw losses, the
    smoothed curve, the suggestion (a marker on the smoothed curve) and the configured LR."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot(lrs, losses, color="tab:blue", alpha=0.3, linewidth=1, label="loss")
    axes.plot(lrs, smoothed, color="tab:blue", linewidth=2, label="smoothed loss")
    axes.axvline(configured, color="gray", linestyle="--", linewidth=1,
                 label=f"configured lr {configured:.2g}")
    if suggestion is not None:
        at = lrs.index(suggestion)
        axes.axvline(suggestion, color="tab:red", linewidth=1)
        axes.plot([suggestion], [smoothed[at]], marker="o", markersize=8, color="tab:red",
                  label=f"suggested lr {suggestion:.2g}")
    low, high = min(*losses, *smoothed), max(smoothed)
    if high > low:  # the raw losses of a diverging last step would squash the curve
        axes.set_ylim(low - 0.05 * (high - low), high + 0.25 * (high - low))
    axes.set_xscale("log")
    axes.set_xlabel("learning rate")
    axes.set_ylabel("training loss")
    axes.set_title("LR range test")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(loc="best")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
