"""What ``ragexp shadow`` prints for people."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragexp.cli.render import fmt, signed, table, terminal

if TYPE_CHECKING:
    from ragexp.workflows.shadow import ShadowOutcome


UNREADABLE_SHOWN = 10
"""Unreadable traces ``ragexp shadow`` lists on the terminal; ``traffic.json`` lists every one."""


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
    for metric in outcome.metrics:
        rows = []
        for row in [metric.overall, *metric.strata]:
            stats = row.stats
            rows.append(
                [
                    row.stratum,
                    str(stats.n if stats else 0),
                    fmt(row.baseline),
                    fmt(row.candidate),
                    signed(stats.delta) if stats else "—",
                    f"[{signed(stats.ci_low)}, {signed(stats.ci_high)}]" if stats else "—",
                    fmt(row.p_holm) if row.p_holm is not None else "",
                    "regressed" if row.regressed else "",
                ]
            )
        print()
        print(f"{terminal(metric.name)} (higher is better)" if metric.direction == "higher" else terminal(metric.name))
        headers = ["stratum", "paired", "production", "candidate", "delta", "interval", "p (Holm)", ""]
        print(table(headers, rows, "lrrrrrrl"))
    worst = outcome.worst
    print()
    print(f"largest credible regression: stratum {terminal(worst)}" if worst else "no stratum credibly regressed")
    base, cand = outcome.production.run_id, outcome.candidate.run_id
    print(f"next: ragexp diff {base} {cand}; ragexp gate --baseline {base} --candidate {cand}")
