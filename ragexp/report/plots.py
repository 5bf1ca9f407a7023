"""Plots as inline SVG strings (matplotlib, already a dependency of mlflow)."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

import numpy as np


def _figure(width: float = 4.2, height: float = 2.6):  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Text stays text in the SVG (the browser's fonts render it), and output is reproducible.
    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "ragexp", "font.size": 9})
    return plt.subplots(figsize=(width, height))


def _svg(fig) -> str:  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    fig.tight_layout()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    # The RDF metadata block only names its vocabularies; inline SVG needs none of it.
    return re.sub(r"<metadata>.*?</metadata>", "", text[text.index("<svg") :], flags=re.DOTALL)


def figure_svg(fig) -> str:  # type: ignore[no-untyped-def]
    """A figure drawn elsewhere, as inline SVG (closed afterwards)."""
    return _svg(fig)


def histogram(values: np.ndarray, name: str, low: float, high: float | None, shown: str | None = None) -> str:
    """``values``: the cases the metric's mean covers; ``shown``: that population in words."""
    fig, ax = _figure()
    finite = values[np.isfinite(values)]
    top = high if high is not None else (float(finite.max()) if finite.size else 1.0) or 1.0
    ax.hist(finite, bins=20, range=(low, top), color="#4C78A8", edgecolor="white")
    ax.set_xlabel(name)
    ax.set_ylabel("cases")
    ax.set_title(f"{name} ({shown or f'n={finite.size}'})")
    return _svg(fig)


def deltas(names: Sequence[str], delta: Sequence[float], low: Sequence[float], high: Sequence[float]) -> str:
    fig, ax = _figure(5.6, 0.45 * len(names) + 1.0)
    y = np.arange(len(names))
    centre = np.array(delta, dtype=float)
    errors = np.vstack([centre - np.array(low, dtype=float), np.array(high, dtype=float) - centre])
    ax.errorbar(centre, y, xerr=np.abs(errors), fmt="o", color="#E45756", capsize=3)
    ax.axvline(0, color="#888888", linewidth=0.8)
    ax.set_yticks(y, labels=list(names))
    ax.set_xlabel("candidate - baseline (mean, 95% CI)")
    ax.invert_yaxis()
    return _svg(fig)


def scatter(baseline: np.ndarray, candidate: np.ndarray, name: str) -> str:
    fig, ax = _figure(3.2, 3.2)
    both = np.isfinite(baseline) & np.isfinite(candidate)
    rng = np.random.default_rng(0)  # a little jitter so that equal scores do not hide each other
    jitter = rng.uniform(-0.01, 0.01, size=(2, int(both.sum())))
    ax.scatter(baseline[both] + jitter[0], candidate[both] + jitter[1], s=10, alpha=0.6, color="#54A24B")
    top = max(1.0, float(np.nanmax(np.concatenate([baseline[both], candidate[both]]))) if both.any() else 1.0)
    ax.plot([0, top], [0, top], color="#888888", linewidth=0.8)
    ax.set_xlabel(f"baseline {name}")
    ax.set_ylabel(f"candidate {name}")
    return _svg(fig)


def judge_vs_human(judge: np.ndarray, human: np.ndarray, name: str, threshold: float | None) -> str:
    """Automatic against human score on the labelled cases, with the line of agreement."""
    fig, ax = _figure(3.2, 3.2)
    both = np.isfinite(judge) & np.isfinite(human)
    rng = np.random.default_rng(0)  # jitter: labels are often on a few levels
    jitter = rng.uniform(-0.015, 0.015, size=(2, int(both.sum())))
    ax.scatter(human[both] + jitter[0], judge[both] + jitter[1], s=14, alpha=0.7, color="#4C78A8")
    ax.plot([0, 1], [0, 1], color="#888888", linewidth=0.8)
    if threshold is not None:
        ax.axvline(threshold, color="#E45756", linewidth=0.6, linestyle="--")
        ax.axhline(threshold, color="#E45756", linewidth=0.6, linestyle="--")
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel(f"human {name}")
    ax.set_ylabel(f"automatic {name}")
    ax.set_title(f"{name} (n={int(both.sum())})")
    return _svg(fig)


PART_COLOURS = {"retrieval": "#4C78A8", "generation": "#F58518", "interaction": "#B279A2"}


def attribution(
    names: Sequence[str], parts: dict[str, Sequence[float]], totals: Sequence[float], labels: dict[str, str]
) -> str:
    """Per metric, its retrieval, generation and interaction parts as one stacked horizontal bar
    (positive parts stacked right of 0, negative ones left), the total as a dot."""
    fig, ax = _figure(5.6, 0.5 * len(names) + 1.2)
    y = np.arange(len(names))
    right = np.zeros(len(names))
    left = np.zeros(len(names))
    for part, colour in PART_COLOURS.items():
        values = np.array(parts[part], dtype=float)
        start = np.where(values >= 0, right, left)
        ax.barh(y, values, left=start, color=colour, height=0.6, label=labels[part])
        right = np.where(values >= 0, right + values, right)
        left = np.where(values < 0, left + values, left)
    ax.scatter(np.array(totals, dtype=float), y, color="#222222", s=16, zorder=3, label=labels["total"])
    ax.axvline(0, color="#888888", linewidth=0.8)
    ax.set_yticks(y, labels=list(names))
    ax.set_xlabel("candidate - baseline (mean)")
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="best")
    return _svg(fig)
