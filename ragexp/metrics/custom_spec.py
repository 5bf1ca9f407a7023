"""A custom metric's spec (``metrics.custom``): its entry checked into a :class:`MetricSpec`, written to
and read from a run's ``metrics.json``, and what changed between two definitions of it."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ragexp import limits
from ragexp.errors import MetricError
from ragexp.metrics.registry import MAX_NAME, YOURS, Custom, MetricSpec, Population, is_metric_name
from ragexp.metrics.requirements import CUSTOM_NEEDS

if TYPE_CHECKING:
    from ragexp.config.models import JudgeMetricConfig, PythonMetricConfig

CUSTOM_KEY = "metrics.custom"
NEEDS_SHOWN = (
    "question",
    "answer",
    "contexts",
    "ranked_ids",
    "citations",
    "reference",
    "expected_facts",
    "relevant_ids",
)
JUDGE_READS = {
    "question": "user_input",
    "response": "response",
    "retrieved_contexts": "retrieved_contexts",
    "reference": "reference",
}
"""The fields a rubric can show the judge -> their names in the judge's inputs (ragas' names)."""
JUDGE_DEFAULT_NEEDS = ("question", "answer")
RUN_FIGURES = ("case_count", "error_count", "evaluation_seconds")
"""What a run logs under a bare name beside its metrics (docs/metrics.md): no metric of the user's may
take one of these names."""
KEY_SEPARATORS = "./: "
"""Characters ragexp's own metric keys use to put a name in a family (``calibration.<metric>.n``):
a custom metric's name holds none, so its keys never meet another figure's."""
MAX_SCALE = 10


def check_custom_name(name: str, where: str) -> None:
    """A name MLflow takes as a metric key, that fits every key ragexp logs about a metric, and
    that is no built-in metric's, alias's or other run figure's."""
    if not 1 <= len(name) <= MAX_NAME:
        raise MetricError(f"{where}: metric names have 1 to {MAX_NAME} characters, got {name!r}")
    reason = limits.problem(limits.METRIC_KEY, name)
    if reason is not None:
        raise MetricError(f"{where}: {name!r} {reason}")
    odd = next((ch for ch in name if ch in KEY_SEPARATORS), None)
    if odd is not None:
        raise MetricError(
            f"{where}: {name!r} holds {odd!r}; a metric of your own is one word of letters, digits, _ and -"
        )
    if is_metric_name(name):
        raise MetricError(f"{where}: '{name}' is a built-in metric (metrics.names takes it); give yours another name")
    if name in RUN_FIGURES:
        raise MetricError(f"{where}: '{name}' is a figure every run logs; give your metric another name")


def custom_spec(entry: PythonMetricConfig | JudgeMetricConfig, index: int, identity: str = "") -> MetricSpec:
    """The :class:`MetricSpec` of ``metrics.custom[index]``, every key checked (one line naming it).
    ``identity``: for a Python metric, what identifies its code (``python:`` + the target and the
    module's version or file hash); a judge metric's comes from its rubric."""
    key = f"{CUSTOM_KEY}[{index}]"
    check_custom_name(entry.name, f"{key}.name")
    low, high = _range(entry.range, f"{key}.range", bounded=entry.kind == "judge")
    words = list(entry.needs) or (list(JUDGE_DEFAULT_NEEDS) if entry.kind == "judge" else [])
    labels: set[str] = set()
    outputs: set[str] = set()
    for word in words:
        known = CUSTOM_NEEDS.get(word)
        if known is None:
            shown = ", ".join(NEEDS_SHOWN)
            raise MetricError(f"{key}.needs: unknown field {word!r} (known: {shown})")
        (outputs if known[0] else labels).add(known[1])
    population: Population = "answerable" if entry.over == "answerable" else "all"
    common: dict[str, Any] = {
        "name": entry.name,
        "direction": entry.direction,
        "low": low,
        "high": high,
        "needs_labels": frozenset(labels),
        "needs_output": frozenset(outputs),
        "source": YOURS,
        "population": population,
        "human_labels": True,
    }
    if entry.kind == "python":
        target = entry.target
        definition = entry.description or f"{target} (a function of yours)"
        return MetricSpec(definition=definition, custom=Custom("python", identity, key, target=target), **common)
    rubric = entry.rubric.strip()
    if not rubric:
        raise MetricError(f"{key}.rubric: empty; write what the judge should check")
    scale = _scale(entry.scale, f"{key}.scale")
    fields = sorted(labels | outputs)
    unreadable = [name for name in fields if name not in JUDGE_READS]
    if unreadable:
        shown = ", ".join(_word(name) for name in JUDGE_READS)
        raise MetricError(
            f"{key}.needs: a rubric shows the judge {shown}; not {_word(unreadable[0])!r} (a Python metric can read it)"
        )
    digest = hashlib.sha256(
        json.dumps(
            {"rubric": rubric, "scale": scale, "fields": fields, "range": [low, high]},
            sort_keys=True,
            ensure_ascii=False,
        ).encode("utf-8")
    ).hexdigest()
    return MetricSpec(
        definition=entry.description or rubric,
        judge=True,
        pass_fail=scale is None and (low, high) == (0.0, 1.0),
        ragas_args=tuple(JUDGE_READS[name] for name in fields),
        custom=Custom("judge", f"judge:{digest[:16]}", key, rubric=rubric, scale=scale),
        **common,
    )


def _word(field_name: str) -> str:
    return next(word for word, (_, name) in CUSTOM_NEEDS.items() if name == field_name)


def _range(given: Sequence[float | None], where: str, *, bounded: bool) -> tuple[float, float | None]:
    if len(given) != 2 or given[0] is None:
        raise MetricError(f"{where}: expected [low, high], got {list(given)}")
    low, high = float(given[0]), given[1]
    if not math.isfinite(low) or (high is not None and (not math.isfinite(high) or high <= low)):
        raise MetricError(f"{where}: expected finite [low, high] with low < high, got {list(given)}")
    if high is None and bounded:
        raise MetricError(f"{where}: a judge's scale is mapped onto the range, which needs a high end")
    return low, None if high is None else float(high)


def _scale(given: object, where: str) -> tuple[int, int] | None:
    if given == "pass_fail":
        return None
    if (
        isinstance(given, list)
        and len(given) == 2
        and all(type(v) is int for v in given)
        and 0 <= given[0] < given[1] <= MAX_SCALE
    ):
        return given[0], given[1]
    raise MetricError(
        f"{where}: expected pass_fail or [low, high], integers from 0 to {MAX_SCALE} with low < high, got {given!r}"
    )


def spec_json(spec: MetricSpec) -> dict[str, Any]:
    """A custom metric's spec as recorded with its run (``custom_metrics.json``)."""
    custom = spec.custom
    if custom is None:
        raise ValueError(f"{spec.name} is a registry metric: the registry defines it")
    return {
        "name": spec.name,
        "kind": custom.kind,
        "key": custom.key,
        "identity": custom.identity,
        "direction": spec.direction,
        "range": [spec.low, spec.high],
        "needs_labels": sorted(spec.needs_labels),
        "needs_output": sorted(spec.needs_output),
        "over": spec.population,
        "pass_fail": spec.pass_fail,
        "definition": spec.definition,
        "target": custom.target,
        "rubric": custom.rubric,
        "scale": list(custom.scale) if custom.scale is not None else None,
        "ragas_args": list(spec.ragas_args),
    }


def spec_from_json(data: Mapping[str, Any]) -> MetricSpec:
    """Inverse of :func:`spec_json` (a KeyError or TypeError on a record this ragexp did not write)."""
    scale = data.get("scale")
    kind = data["kind"]
    custom = Custom(
        kind,
        str(data["identity"]),
        str(data.get("key", CUSTOM_KEY)),
        target=data.get("target"),
        rubric=data.get("rubric"),
        scale=(int(scale[0]), int(scale[1])) if scale else None,
    )
    low, high = data["range"]
    return MetricSpec(
        name=str(data["name"]),
        direction="lower" if data["direction"] == "lower" else "higher",
        low=float(low),
        high=None if high is None else float(high),
        needs_labels=frozenset(data.get("needs_labels", ())),
        needs_output=frozenset(data.get("needs_output", ())),
        source=YOURS,
        definition=str(data.get("definition", "")),
        population="answerable" if data.get("over") == "answerable" else "all",
        judge=kind == "judge",
        human_labels=True,
        pass_fail=bool(data.get("pass_fail", False)),
        ragas_args=tuple(data.get("ragas_args", ())),
        custom=custom,
    )


def definition_change(baseline: MetricSpec | None, candidate: MetricSpec | None) -> str | None:
    """Why two runs' values of one metric cannot be compared: the metric of that name is defined
    differently in each (None when they mean the same)."""
    if baseline is None or candidate is None or (baseline.custom is None and candidate.custom is None):
        return None
    a, b = baseline.custom, candidate.custom
    if a is None or b is None:
        return "a metric of your own in one run, the built-in one in the other"
    if a.kind == b.kind == "python" and a.target != b.target:
        return f"target differs ({a.target} vs {b.target})"
    if a.kind == b.kind == "python" and a.identity != b.identity:
        code = (a.identity.rpartition("@")[2], b.identity.rpartition("@")[2])
        return f"the code of {a.target} changed ({_short(code[0])} vs {_short(code[1])})"
    if a.kind == b.kind == "judge" and (a.rubric, a.scale) != (b.rubric, b.scale):
        return f"the rubric or its scale changed ({_short(a.identity)} vs {_short(b.identity)})"
    for what, left, right in (
        ("kind", a.kind, b.kind),
        ("definition", a.identity, b.identity),
        ("direction", baseline.direction, candidate.direction),
        ("range", (baseline.low, baseline.high), (candidate.low, candidate.high)),
        ("cases", baseline.population, candidate.population),
    ):
        if left != right:
            return f"{what} differs ({_short(left)} vs {_short(right)})"
    return None


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:24] + "…"
