"""What ``ragexp shadow`` prints for people."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragexp.cli.render import fmt, signed, table, terminal

if TYPE_CHECKING:
    from ragexp.stats.strata import MetricStrata
    from ragexp.workflows.shadow import ShadowOutcome


UNREADABLE_SHOWN = 10
"""Unreadable traces ``ragexp shadow`` lists on the terminal; ``traffic.json`` lists every one."""


def show_strata(metrics: list[MetricStrata], roles: tuple[str, str] = ("production", "candidate")) -> None:
    """Each metric overall and per stratum, worst first; with people's labels, the
    prediction-powered delta and its interval beside the judged one."""
    for metric in metrics:
        every = [metric.overall, *metric.strata]
        labelled = any(row.labelled for row in every)
        rows = []
        for row in every:
            stats = row.stats
            cells = [
                row.stratum,
                str(stats.n if stats else 0),
                fmt(row.baseline),
                fmt(row.candidate),
                signed(stats.delta) if stats else "—",
                f"[{signed(stats.ci_low)}, {signed(stats.ci_high)}]" if stats else "—",
                fmt(row.p_holm) if row.p_holm is not None else "",
                "regressed" if row.regressed else "",
            ]
            if labelled:
                ppi = row.ppi
                cells[-1:-1] = [
                    str(row.labelled),
                    signed(ppi.mean) if ppi else "—",
                    f"[{signed(ppi.ci_low)}, {signed(ppi.ci_high)}]" if ppi else "—",
                ]
            rows.append(cells)
        print()
        print(f"{terminal(metric.name)} (higher is better)" if metric.direction == "higher" else terminal(metric.name))
        headers = ["stratum", "paired", *roles, "judged delta", "interval", "p (Holm)", ""]
        align = "lrrrrrrl"
        if labelled:
            headers[-1:-1] = ["labelled", "PPI delta", "PPI interval"]
            align = "lrrrrrrrrrl"
        print(table(headers, rows, align))
        if labelled:
            print("PPI: the judged delta corrected by the labelled pairs (people's difference - the judge's)")


def show_shadow(outcome: ShadowOutcome) -> None:
    """``ragexp shadow``: the two runs, then each metric overall and per stratum, worst first."""
    traffic = outcome.traffic
    print(traffic.describe())
    for item in traffic.unreadable[:UNREADABLE_SHOWN]:
        print(f"  unreadable: {terminal(item.trace_id)}: {terminal(item.reason)}")
    if len(traffic.unreadable) > UNREADABLE_SHOWN:
        print(f"  ... {len(traffic.unreadable) - UNREADABLE_SHOWN} more in traffic.json")
    print(f"production run {outcome.production.run_id}, candidate run {outcome.candidate.run_id}")
    print(f"  experiment {terminal(outcome.experiment)}")
    show_strata(outcome.metrics)
    worst = outcome.worst
    print()
    print(f"largest credible regression: stratum {terminal(worst)}" if worst else "no stratum credibly regressed")
    base, cand = outcome.production.run_id, outcome.candidate.run_id
    print(f"next: ragexp diff {base} {cand}; ragexp gate --baseline {base} --candidate {cand}")
