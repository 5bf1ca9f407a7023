"""``ragexp sweep PARENT``, whole: read the sweep's points, compare them
(:mod:`ragexp.compare.sweeps`), and log the analysis and a plot of its front to the parent run."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from ragexp import strict_json
from ragexp.compare.data import RunData, load_run
from ragexp.compare.sweeps import COST, LATENCY, Point, SweepAnalysis, analyse
from ragexp.errors import TrackingError
from ragexp.metrics.registry import case_values_metric
from ragexp.tracking.store import FINISHED, TAG_PREFIX, Store

SWEEP_JSON = "sweep/sweep.json"
FRONT_PNG = "sweep/front.png"
"""What ``ragexp sweep`` logs to the parent run: the analysis (as ``--json`` prints it) and the plot."""


def sweep_analysis(
    parent: str,
    *,
    tracking_uri: str | None,
    baseline: str | None = None,
    metric: str | None = None,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    say: Callable[[str], None] = lambda _: None,
) -> SweepAnalysis:
    """Compare the points of the sweep ``parent`` and log the result to it."""
    store = Store(tracking_uri, read_only=True)  # read, and the analysis logged to the parent (no new store)
    record = store.get_run(parent)
    if record.tag("sweep.role") != "parent":
        raise TrackingError(
            f"run {parent} is not the parent run of a sweep (`ragexp run -m`; no ragexp.sweep.role tag)"
        )
    experiment = store.experiment_name(record.experiment_id)
    records = store.search(experiment, limit=10_000, filter_string=f"tags.`{TAG_PREFIX}sweep` = '{parent}'")
    records.sort(key=lambda r: int(r.tag("sweep.num", "0") or 0))
    skipped = {r.run_id: f"point {r.tag('sweep.num')} is {r.status.lower()}" for r in records if r.status != FINISHED}
    for run_id, why in skipped.items():
        say(f"left out: run {run_id}: {why}")
    finished = [r for r in records if r.run_id not in skipped]
    swept = _swept([r.tag("sweep.point") for r in finished])
    points = [
        _point(load_run(store, r), int(r.tag("sweep.num", "0") or 0), label)
        for r, label in zip(finished, swept, strict=True)
    ]
    if baseline is None:
        if not points:
            raise TrackingError(f"sweep {parent}: no finished point")
        base = points[0]
    else:
        base = next((p for p in points if p.run_id == baseline), None) or _point(load_run(store, baseline), -1, "")
    analysis = analyse(
        parent,
        points,
        base,
        metric=metric,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        skipped=skipped,
    )
    with tempfile.TemporaryDirectory(prefix="ragexp-sweep-") as tmp:
        folder = Path(tmp) / "sweep"
        folder.mkdir()
        (folder / "sweep.json").write_text(strict_json.dumps(analysis.to_json(), indent=2), encoding="utf-8")
        front_plot(analysis, folder / "front.png")
        store.log_dir(parent, Path(tmp))
    return analysis


def _swept(labels: list[str]) -> list[str]:
    """Each point's overrides without those every point shares (the sweep's fixed overrides)."""
    items = [label.split() for label in labels]
    shared = set.intersection(*(set(i) for i in items)) if len(items) > 1 else set()
    return [" ".join(item for item in i if item not in shared) for i in items]


def _point(run: RunData, number: int, overrides: str) -> Point:
    names = [*run.metrics, LATENCY, COST, case_values_metric("errored").name]
    return Point(run, number, overrides, {name: run.summary(name) for name in dict.fromkeys(names)})


def front_plot(analysis: SweepAnalysis, path: Path) -> None:
    """The points on the quality axis against p95 latency (or cost, or the point number), the
    front joined, each point's status in its colour and its overrides beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    axis = analysis.metric
    x_name = LATENCY if LATENCY in analysis.objectives else COST if COST in analysis.objectives else None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colours = {"front": "#E45756", "indistinguishable": "#F2A541", "dominated": "#9D9D9D"}
    words = {
        "front": "on the front",
        "indistinguishable": "not distinguishable from the front",
        "dominated": f"dominated ({analysis.confidence:.0%} confidence)",
    }
    for status, colour in colours.items():
        chosen = [p for p in analysis.points if p.status == status]
        if not chosen:
            continue
        xs = [_x(p, x_name) for p in chosen]
        ys = [p.metrics.get(axis) or 0.0 for p in chosen]
        ax.scatter(xs, ys, s=60.0, color=colour, label=words[status], zorder=3)
    front = sorted(analysis.front, key=lambda p: _x(p, x_name))
    ax.plot([_x(p, x_name) for p in front], [p.metrics.get(axis) or 0.0 for p in front], color="#E45756", lw=1)
    for point in analysis.points:
        text = _short_label(point)
        if COST in analysis.objectives and x_name != COST:
            text += f" ({COST} {point.metrics.get(COST):.3g})"
        where = (_x(point, x_name), point.metrics.get(axis) or 0.0)
        ax.annotate(text, where, fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.margins(x=0.25, y=0.1)
    ax.set_xlabel(x_name or "point")
    ax.set_ylabel(axis)
    ax.set_title(f"sweep {analysis.parent[:8]}: {axis} vs {x_name or 'point'}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _short_label(point: Point) -> str:
    """A point's overrides with each key cut to its last part (``chunking=doc``), to fit a plot."""
    if not point.overrides:
        return point.run_id[:8]
    parts = [item.partition("=") for item in point.overrides.split()]
    return " ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, _, value in parts)


def _x(point: Point, name: str | None) -> float:
    if name is None:
        return float(point.number)
    value = point.metrics.get(name)
    return float(value) if value is not None else 0.0
