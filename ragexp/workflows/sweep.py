"""``ragexp sweep PARENT``, whole: read the sweep's points, compare them
(:mod:`ragexp.compare.sweeps`), and log the analysis and a plot of its front to the parent run."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from ragexp import artifacts, strict_json
from ragexp.compare.data import RunData, load_run
from ragexp.compare.figures import fmt
from ragexp.compare.sweeps import (
    COST,
    LATENCY,
    Confirmation,
    Point,
    SweepAnalysis,
    analyse,
    check_same_cases,
    delta_cells,
    override_words,
    shown_override,
    subset_metrics,
    varying_overrides,
)
from ragexp.errors import TrackingError
from ragexp.metrics.registry import case_values_metric
from ragexp.phrases import t
from ragexp.report.build import Doc, Report, page
from ragexp.report.plots import figure_svg
from ragexp.tracking.store import FINISHED, TAG_PREFIX, Store

SWEEP_JSON, FRONT_PNG = artifacts.SWEEP, artifacts.SWEEP_FRONT


def sweep_analysis(
    parent: str,
    *,
    tracking_uri: str | None,
    baseline: str | None = None,
    metric: str | None = None,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    confirm: float | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> SweepAnalysis:
    """Compare the points of the sweep ``parent`` and log the result to it. ``confirm``: hold
    out that share of the cases, choose on the rest, and confirm the winner on the held-out
    cases with a run of its own, gated against the baseline (:mod:`ragexp.workflows.multirun_confirm`)."""
    store = Store(tracking_uri, must_exist=True)  # read, and the analysis logged to the parent (no new store)
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
    swept, _ = varying_overrides([r.tag("sweep.point") for r in finished])
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
    confirmation = None
    if confirm is not None:
        check_same_cases(base.run, [point.run for point in points])
        from ragexp.workflows.multirun_confirm import held_out

        chosen, held = held_out(base.run, confirm, seed)
        confirmation = Confirmation(confirm, len(chosen), held)
        points = [_subset(point, chosen) for point in points]
        base = next((p for p in points if p.run_id == base.run_id), None) or _subset(base, chosen)
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
    if confirmation is not None:
        from ragexp.workflows.multirun_confirm import confirm_winner

        analysis.confirm = confirm_winner(analysis, confirmation, store, say=say)
    with tempfile.TemporaryDirectory(prefix="ragexp-sweep-") as tmp:
        (Path(tmp) / SWEEP_JSON).parent.mkdir()
        (Path(tmp) / SWEEP_JSON).write_text(strict_json.dumps(analysis.to_json(), indent=2), encoding="utf-8")
        front_plot(analysis, Path(tmp) / FRONT_PNG)
        store.log_dir(parent, Path(tmp))
    return analysis


def _subset(point: Point, case_ids: list[str]) -> Point:
    """The point as seen on ``case_ids`` alone: its figures computed over those cases."""
    run = point.run.select(case_ids)
    return Point(run, point.number, point.overrides, subset_metrics(run, list(point.metrics), point.metrics))


def _point(run: RunData, number: int, overrides: str) -> Point:
    names = [*run.metrics, LATENCY, COST, case_values_metric("errored").name]
    return Point(run, number, overrides, {name: run.summary(name) for name in dict.fromkeys(names)})


def front_plot(analysis: SweepAnalysis, path: Path) -> None:
    """:func:`front_figure` as a PNG file (what the parent run shows in MLflow's UI)."""
    import matplotlib.pyplot as plt

    fig = front_figure(analysis)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def front_figure(analysis: SweepAnalysis):  # type: ignore[no-untyped-def]  # a matplotlib Figure
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
    return fig


def _short_label(point: Point) -> str:
    """A point's overrides with each key cut to its last part (``chunking=doc``), to fit a plot."""
    if not point.overrides:
        return point.run_id[:8]
    parts = [shown_override(item).partition("=") for item in override_words(point.overrides)]
    return " ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, _, value in parts)


def _x(point: Point, name: str | None) -> float:
    if name is None:
        return float(point.number)
    value = point.metrics.get(name)
    return float(value) if value is not None else 0.0


def sweep_report(analysis: SweepAnalysis, language: str) -> Report:
    """The sweep's report: its points against the baseline, the front and its plot, the recommendation."""
    doc = Doc()
    doc.heading(f"{t('sweep_title', language)} · {analysis.parent}", 1)
    doc.heading(t("sweep_points", language))
    shown = analysis.objectives[1:]
    rows = []
    for point in analysis.points:
        rows.append(
            [
                str(point.number) if point.number >= 0 else "-",
                point.shown or point.run_id,
                point.run_id,
                *delta_cells(analysis, point),
                *(fmt(point.metrics.get(name)) for name in shown),
                f"{int(point.run.errored.sum())}/{len(point.run.case_ids)}",
                t(f"sweep_status_{point.status}", language),
            ]
        )
    headers = [t("sweep_point", language), t("sweep_overrides", language), "run"]
    headers += [f"{t('delta', language)} {name}" for name in analysis.quality] + shown
    doc.table([*headers, t("sweep_errored", language), t("sweep_pareto", language)], rows)
    family = {
        "baseline": analysis.baseline.label,
        "tests": analysis.tests,
        "confidence": f"{analysis.confidence:.0%}",
        "level": f"{analysis.level:.2%}",
    }
    doc.para(t("sweep_family", language, **family))
    doc.heading(t("sweep_front", language))
    front = ", ".join(point.label for point in analysis.front)
    doc.para(t("sweep_front_over", language, axes=" x ".join(analysis.objectives), front=front))
    for name, why in analysis.left_out.items():
        doc.para(f"{name}: {why}")
    doc.figure("front.svg", figure_svg(front_figure(analysis)), " x ".join(analysis.objectives))
    doc.heading(t("sweep_recommendation", language))
    doc.para(analysis.recommendation.text())
    title = f"{t('sweep_title', language)} · {analysis.parent}"
    return Report("\n".join(doc.md).strip() + "\n", page(doc, language, title), doc.svgs)


def sweep_language(store: Store, analysis: SweepAnalysis, language: str | None) -> str:
    """``--language``, else the baseline's ``report.language``, else Chinese."""
    if language:
        return language
    config = yaml.safe_load(store.read_artifact(analysis.baseline.run_id, artifacts.CONFIG)) or {}
    return str(config.get("report", {}).get("language") or "zh")
