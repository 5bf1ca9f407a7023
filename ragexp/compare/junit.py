"""``ragexp gate --junit FILE``: the gate as a JUnit XML test report for GitLab, Jenkins and friends.

One test suite per gate, one test case per rule (classname: the metric, name: the rule). A rule
that failed is a ``<failure>``, a rule that could not be decided (a missing score, an uncalibrated
judge) an ``<error>``; both carry baseline, candidate, threshold and the message. A rule that
allows a change below what the comparison can detect says so in its ``<system-out>``. The suite's
properties identify what was compared: run ids, config hashes, dataset hash. The layout follows
the Jenkins xunit ``junit-10.xsd`` schema, which GitLab's and Jenkins' importers accept.
"""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from datetime import UTC, datetime

from ragexp.compare.diff import DiffResult
from ragexp.compare.figures import fmt, threshold
from ragexp.compare.gate import GateResult, RuleResult
from ragexp.escape import xml


def junit_xml(
    result: GateResult,
    diff: DiffResult,
    *,
    seconds: float,
    extra: Mapping[str, str] | None = None,
) -> bytes:
    """The report as UTF-8 bytes. ``seconds``: how long the gate took; ``extra``: more properties
    (how each run was selected, links to the runs)."""
    failures = sum(r.outcome == "failed" for r in result.rules)
    errors = sum(r.outcome == "undecided" for r in result.rules)
    counts = {"tests": str(result.checked), "failures": str(failures), "errors": str(errors)}
    time = f"{max(seconds, 0.0):.3f}"
    root = ET.Element("testsuites", {"name": "ragexp gate", **counts, "time": time})
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": xml(f"ragexp gate {result.gates}"),
            **counts,
            "skipped": "0",
            "time": time,
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
            "hostname": socket.gethostname(),
        },
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in _properties(result, diff, extra or {}).items():
        ET.SubElement(properties, "property", {"name": name, "value": xml(value)})
    for rule in result.rules:
        case = ET.SubElement(suite, "testcase", {"classname": xml(rule.metric), "name": xml(rule.rule), "time": "0"})
        if rule.outcome != "passed":
            tag = "failure" if rule.outcome == "failed" else "error"
            element = ET.SubElement(case, tag, {"type": rule.outcome, "message": xml(rule.message)})
            element.text = xml(_details(rule))
        cannot_tell = rule.cannot_tell()
        if cannot_tell:
            # Beside the outcome, never instead of it: an underpowered rule still passes or fails.
            ET.SubElement(case, "system-out").text = xml(cannot_tell)
    ET.indent(root)
    body: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return body + b"\n"


def _properties(result: GateResult, diff: DiffResult, extra: Mapping[str, str]) -> dict[str, str]:
    base, cand = diff.baseline.record, diff.candidate.record
    found = {
        "ragexp.gates": result.gates,
        "ragexp.verdict": "passed" if result.passed else "failed",
        "baseline.run_id": base.run_id,
        "candidate.run_id": cand.run_id,
        "baseline.config_hash": base.tag("config_hash"),
        "candidate.config_hash": cand.tag("config_hash"),
        "dataset_hash": base.tag("dataset_hash"),
    }
    if cand.tag("dataset_hash") != base.tag("dataset_hash"):
        # Only with --allow-incomparable; both are shown so nobody mistakes one for the other.
        found["candidate.dataset_hash"] = cand.tag("dataset_hash")
    if diff.differences:
        found["ragexp.compared_although_incomparable"] = "; ".join(diff.differences)
    found.update(extra)
    return found


def _details(rule: RuleResult) -> str:
    return (
        f"baseline: {fmt(rule.baseline)}\n"
        f"candidate: {fmt(rule.candidate)}\n"
        f"threshold: {threshold(rule.threshold)}\n"
        + (f"compared: {rule.population}\n" if rule.population else "")
        + f"{rule.message}"
    )
