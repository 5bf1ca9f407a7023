"""What the dataset commands print for people: ``ragexp validate`` (a dataset's checks, an anchored
dataset, a probe of the system) and the ledger of ``ragexp datasets diff``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ragexp.cli.render import terminal
from ragexp.workflows.datasets import VersionDiff


def show_validation(summary: dict[str, Any], findings: Sequence[Any] | None) -> None:
    print(
        f"ok: {terminal(summary['path'])}: {summary['case_count']} cases ({summary['unanswerable']} unanswerable), "
        f"format {summary['format']}, dataset hash {summary['dataset_hash'][:12]}"
    )
    print(f"labels: {terminal(', '.join(summary['label_fields']))}")
    print(f"recorded outputs: {terminal(', '.join(summary['output_fields']) or 'none')}")
    print(f"runs log to: {terminal(summary['tracking_uri'])}")
    if summary["human_labels"]:
        counts = ", ".join(f"{name} {count}" for name, count in summary["human_labels"].items())
        print(f"human scores: {terminal(counts)}")
    if "evidence" in summary:
        evidence = summary["evidence"]
        against = evidence["checked_against"]
        checked = f"checked against {terminal(against)}" if against else "not checked: no corpus"
        spans = f"{evidence['spans']} spans in {evidence['cases']} cases ({evidence['offsets']} as offsets)"
        print(f"evidence: {spans}, {checked}")
    if findings is not None:
        print(f"label audit against {terminal(summary['corpus'])}: {len(findings)} finding(s)")
        for finding in findings:
            print(f"  warning: {terminal(finding)}")
    if "probe" in summary:
        show_probe(summary["probe"])


def show_anchored(anchored: Any) -> None:
    """``validate --anchor``'s line: where the evidence went and what it is made of."""
    print(
        f"wrote {terminal(str(anchored.out))}: {anchored.anchored} of {anchored.cases} cases anchored to documents; "
        f"{anchored.spans_from_facts} spans are the sentences holding their facts, "
        f"{anchored.spans_whole_chunk} whole {'chunk' if anchored.spans_whole_chunk == 1 else 'chunks'}"
    )


def show_probe(report: dict[str, Any]) -> None:
    sent = report.get("params" if report.get("method") == "GET" else "body")
    print(terminal(f"probe: case {report['case_id']}: {report['method']} {report['url']}"))
    print(terminal(f"  sent: {json.dumps(sent, ensure_ascii=False)}"))
    if "status" in report:
        print(
            f"  reply: HTTP {report['status']} in {report['seconds']:g} s, {report['bytes']:,} bytes "
            f"({report['content_type'] or 'no content type'})"
        )
    elif "raw" in report:
        print(f"  returned in {report['seconds']:g} s, as plain data:")
    if "raw" in report:
        for line in str(report["raw"]).splitlines() or [""]:
            print(f"  | {terminal(line)}")
    missing = report.get("missing", {})
    for key, value in report.get("extracted", {}).items():
        if key in missing:
            found = "nothing found" if value is None else json.dumps(value, ensure_ascii=False)
            print(terminal(f"  {key} -> {found}  <- found nothing: {missing[key]}"))
        else:
            print(terminal(f"  {key} -> {json.dumps(value, ensure_ascii=False)}"))
    if report.get("error"):
        print(terminal(f"  error: {report['error']}"))
    elif report.get("output") is not None:
        print(terminal(f"  output: {json.dumps(report['output'], ensure_ascii=False)}"))


def show_ledger(found: VersionDiff, *, listed: int = 20) -> None:
    """``ragexp datasets diff``: the counts, then the ids of each kind (the first ``listed``)."""
    ledger = found.ledger
    print(f"old {terminal(found.old)}")
    print(f"new {terminal(found.new)}")
    print(terminal(ledger.words()))
    for kind, ids in (("added", ledger.added), ("removed", ledger.removed)):
        for case_id in ids[:listed]:
            print(f"  {kind:<9} {terminal(case_id)}")
        if len(ids) > listed:
            print(f"  {kind:<9} ... {len(ids) - listed} more (--json lists every id)")
    changed = list(ledger.changed.items())
    for case_id, parts in changed[:listed]:
        print(f"  {'changed':<9} {terminal(case_id)}: {', '.join(parts)}")
    if len(changed) > listed:
        print(f"  {'changed':<9} ... {len(changed) - listed} more (--json lists every id)")
