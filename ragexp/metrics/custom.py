"""The team's own metrics (``metrics.custom``): loaded and checked before the run, scored beside
the built-in ones.

A ``python`` metric is a function of the team's code, ``(case, output) -> value``, imported as a
Python system's target is and called on worker threads under a per-call deadline
(:func:`ragexp.usercode.calls.call_each`). A ``judge`` metric is a rubric the configured judge
scores, through the judge's own client, cache and repeats (:mod:`ragexp.metrics.judge.rubric`);
only its spec is made here. What each metric is (name, direction, range, fields, identity) is the
:func:`~ragexp.metrics.custom_spec.custom_spec`.

A value is read by :func:`read_values`: a number or a bool, or ``{"score", "rationale"}`` (an
MLflow ``Feedback`` reads the same). Anything else, a NaN, a value outside the metric's range, a
raise or a timeout is an error for that case's metric, with the reason, never a score.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ragexp import secrets
from ragexp.errors import MetricError, ProviderError
from ragexp.metrics.custom_spec import custom_spec
from ragexp.metrics.registry import MetricSpec

if TYPE_CHECKING:
    from ragexp.config.models import JudgeMetricConfig, PythonMetricConfig
    from ragexp.records import Case, CaseResult, SystemOutput

# The Python-target machinery (and the HTTP stack it imports) is loaded by the runs that have a
# Python metric, not by every run: each function below imports what it calls.

SLACK = 1e-9
"""A value this far outside its range is rounding (``0.1 + 0.2``) and is clipped, as the judge's are."""
REASON_CHARS = 300
SCORER_ARGUMENTS = ("inputs", "outputs", "expectations")
"""What ragexp passes an MLflow scorer, by the names MLflow passes them (``trace`` and ``session``
it cannot)."""
YES_NO = {"yes": 1.0, "no": 0.0}
"""MLflow's categorical judge answers, as scores."""
OUTPUT = operator.attrgetter("output")


@dataclass(frozen=True)
class PythonMetric:
    """A Python metric, ready to call."""

    spec: MetricSpec
    function: Callable[[Case, SystemOutput], Any]
    """Called once per case: the user's function, or an MLflow scorer behind an adapter."""
    timeout_s: float
    """Deadline of one call."""


@dataclass(frozen=True)
class CustomMetrics:
    """Every metric of ``metrics.custom``, in config order."""

    specs: list[MetricSpec] = field(default_factory=list)
    python: list[PythonMetric] = field(default_factory=list)

    def identities(self) -> dict[str, str]:
        """Metric -> what identifies it (the config hash takes these)."""
        return {spec.name: spec.custom.identity for spec in self.specs if spec.custom is not None}


def load_custom(entries: Sequence[PythonMetricConfig | JudgeMetricConfig]) -> CustomMetrics:
    """Check every entry (one line naming its key) and import every Python metric's target."""
    specs: list[MetricSpec] = []
    python: list[PythonMetric] = []
    for index, entry in enumerate(entries):
        spec = custom_spec(entry, index)
        if entry.kind == "python" and spec.custom is not None:
            from ragexp.usercode.imports import source_identity

            function, module = load_function(entry.target, entry.path, spec.custom.key)
            identity = f"python:{entry.target}@{source_identity(module)}"
            spec = dataclasses.replace(spec, custom=dataclasses.replace(spec.custom, identity=identity))
            python.append(PythonMetric(spec, function, entry.timeout_s))
        specs.append(spec)
    return CustomMetrics(specs, python)


def load_function(target: str, path: str | None, key: str) -> tuple[Callable[[Case, SystemOutput], Any], Any]:
    """The function ``target`` names, as ``(case, output) -> value``, and its module; a
    MetricError naming ``key.target`` when it cannot be called so."""
    from ragexp.usercode.imports import import_target

    try:
        obj, module = import_target(target, path, key)
    except ProviderError as exc:
        raise MetricError(str(exc)) from None
    if _is_mlflow_scorer(obj):
        return _scorer_adapter(obj, target, key), module
    if inspect.isclass(obj) or not callable(obj):
        raise MetricError(f"{key}.target: '{target}' is {type(obj).__name__}, not a function (case, output)")
    if inspect.iscoroutinefunction(obj) or inspect.iscoroutinefunction(getattr(obj, "__call__", None)):  # noqa: B004
        raise MetricError(f"{key}.target: '{target}' is async; a metric function is called as def f(case, output)")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return obj, module  # a builtin without a signature: its first call says whether it fits
    try:
        signature.bind(None, None)
    except TypeError:
        shown = str(signature.replace(return_annotation=inspect.Signature.empty))
        raise MetricError(
            f"{key}.target: cannot call '{target}{shown}' as (case, output): a metric function takes the case "
            "and the system's output"
        ) from None
    return obj, module


def _is_mlflow_scorer(obj: Any) -> bool:
    """An MLflow ``Scorer`` (``@scorer`` makes one), told by its class without importing MLflow."""
    return any(
        cls.__name__ == "Scorer" and cls.__module__.startswith("mlflow.genai.scorers") for cls in type(obj).__mro__
    )


def _scorer_adapter(scorer: Any, target: str, key: str) -> Callable[[Case, SystemOutput], Any]:
    """Call an MLflow scorer as ``Scorer.run`` does: with the arguments its ``__call__`` names,
    among ``inputs`` (``{"question"}``), ``outputs`` (the answer) and ``expectations`` (the
    case's labels under MLflow's names, as on the case's trace)."""
    parameters = inspect.signature(scorer.__call__).parameters
    unknown = [name for name in ("trace", "session") if name in parameters]
    if unknown:
        raise MetricError(
            f"{key}.target: the MLflow scorer '{target}' takes '{unknown[0]}', which ragexp does not pass "
            f"(it passes {', '.join(SCORER_ARGUMENTS)})"
        )
    wanted = [name for name in SCORER_ARGUMENTS if name in parameters]
    from ragexp.records import case_expectations

    def call(case: Case, output: SystemOutput) -> Any:
        given = {
            "inputs": {"question": case.question},
            "outputs": output.answer,
            "expectations": case_expectations(case),
        }
        return scorer(**{name: given[name] for name in wanted})

    return call


def score_python(
    metrics: Sequence[PythonMetric],
    cases: Sequence[Case],
    results: Sequence[CaseResult],
    answered: np.ndarray,
    *,
    workers: int,
) -> dict[str, np.ndarray]:
    """Metric -> (n,) scores, NaN where there is none. ``answered``: (n,) bool, the case's system
    call succeeded; the others are not scored (each is its case's error already). A metric over
    answerable cases skips the unanswerable ones. Every value that is not a score goes into its
    case's ``metric_errors`` with the reason, a rationale into its ``rationale``."""
    from ragexp.usercode.calls import call_each

    n = len(cases)
    scores: dict[str, np.ndarray] = {}
    for metric in metrics:
        spec = metric.spec
        wanted = answered
        if spec.population == "answerable":
            wanted = answered & ~np.fromiter((case.unanswerable for case in cases), dtype=bool, count=n)
        if wanted.all():
            chosen: Sequence[int] = range(n)
            firsts, seconds = cases, results
        else:
            chosen = np.flatnonzero(wanted).tolist()
            firsts, seconds = [cases[i] for i in chosen], [results[i] for i in chosen]
        raw = call_each(metric.function, firsts, seconds, workers=workers, timeout_s=metric.timeout_s, second_of=OUTPUT)
        values, problems, rationales = read_values(raw, spec, metric.timeout_s)
        if len(chosen) == n:
            column = values
        else:
            column = np.full(n, np.nan)
            column[wanted] = values
        for position, reason in problems.items():
            results[chosen[position]].metric_errors[spec.name] = reason
        for position, text in rationales.items():
            results[chosen[position]].rationale[spec.name] = text
        scores[spec.name] = column
    return scores


def score_python_guarded(
    metrics: Sequence[PythonMetric],
    cases: Sequence[Case],
    results: Sequence[CaseResult],
    answered: np.ndarray,
    *,
    workers: int,
) -> dict[str, np.ndarray]:
    """:func:`score_python`, one metric at a time, with what each metric was given checked after
    it: a function that changed a case or its output (a question rewritten, an answer emptied)
    would change what the run records and what later metrics read. The change is undone (the
    state from before the metric is put back) and that metric is an error for that case."""
    import orjson

    def state(index: int) -> bytes:
        return orjson.dumps((cases[index], results[index].output), default=_plain)

    before = [state(i) if answered[i] else b"" for i in range(len(cases))]
    scores: dict[str, np.ndarray] = {}
    for metric in metrics:
        column = score_python([metric], cases, results, answered, workers=workers)[metric.spec.name]
        for index in np.flatnonzero(answered).tolist():
            if state(index) == before[index]:
                continue
            _restore(cases[index], results[index], orjson.loads(before[index]))
            column[index] = np.nan
            results[index].rationale.pop(metric.spec.name, None)
            results[index].metric_errors[metric.spec.name] = (
                "changed the case or the output it was given (the metric's function must only read them); "
                "the change was undone"
            )
        scores[metric.spec.name] = column
    return scores


def _plain(value: Any) -> Any:
    if isinstance(value, frozenset | set):
        return sorted(value)
    raise TypeError(type(value).__name__)


def _restore(case: Case, result: CaseResult, saved: list[Any]) -> None:
    """Put back the case and output a metric changed, from their :func:`score_python_guarded` state."""
    from ragexp.records import Evidence, SystemOutput

    data, output = saved
    for name, value in data.items():
        if name == "recorded":
            value = None if value is None else SystemOutput(**value)
        elif name == "recorded_fields":
            value = frozenset(value)
        elif name == "relevant":
            value = [Evidence(**item) for item in value]
        setattr(case, name, value)
    result.output = None if output is None else SystemOutput(**output)


def read_values(
    raw: Sequence[Any], spec: MetricSpec, timeout_s: float
) -> tuple[np.ndarray, dict[int, str], dict[int, str]]:
    """(scores, position -> why there is none, position -> rationale) of what the calls gave.

    Numbers and bools, the common case, are read as one array; anything else one by one."""
    low, high = spec.low, spec.high if spec.high is not None else math.inf
    problems: dict[int, str] = {}
    rationales: dict[int, str] = {}
    values = _bools_and_small_ints(raw)
    if values is None:
        try:
            array = np.array(raw) if raw else np.zeros(0)
        except (ValueError, TypeError, OverflowError):  # ragged lists and the like: read one by one
            array = np.array(raw, dtype=object)
        values = array.astype(np.float64) if array.ndim == 1 and array.dtype.kind in "biuf" else None
    if values is None:
        from ragexp.usercode import calls

        values = np.full(len(raw), np.nan)
        for position, value in enumerate(raw):
            number, reason, rationale = _read_one(value, spec, timeout_s, calls)
            if reason is not None:
                problems[position] = reason
            else:
                values[position] = number
            if rationale:
                rationales[position] = rationale
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values < low - SLACK) | (values > high + SLACK)
    for position in np.flatnonzero(bad).tolist():
        if position not in problems:
            problems[position] = _out_of_range(float(values[position]), spec)
    values[bad] = np.nan
    np.clip(values, low, high, out=values)
    for position in problems:
        rationales.pop(position, None)
    return values, problems, rationales


def _bools_and_small_ints(raw: Sequence[Any]) -> np.ndarray | None:
    """The values as floats when every one is a bool or an integer from 0 to 255 (a pass/fail
    rule's answers), else None. ``bytes`` takes exactly those, in one C pass: five times
    faster than numpy finding the type of each."""
    try:
        return np.frombuffer(bytes(raw), dtype=np.uint8).astype(np.float64)
    except Exception:  # a float, a dict, an error...: the general path decides
        return None


def _read_one(value: Any, spec: MetricSpec, timeout_s: float, calls: Any) -> tuple[float, str | None, str | None]:
    """(score, why there is none, rationale) of one call's value (``calls``: the module that made
    the calls, :mod:`ragexp.usercode.calls`)."""
    if value is calls.TIMED_OUT:
        key = spec.custom.key if spec.custom is not None else "metrics.custom"
        return math.nan, f"timed out after {timeout_s:g} s ({key}.timeout_s)", None
    if isinstance(value, calls.Raised):
        try:
            said = calls.failure_text(value.error).splitlines()[0][:REASON_CHARS]
        except Exception:  # an exception that cannot be printed is still said by its type
            said = type(value.error).__name__
        return math.nan, f"raised {said}", None
    rationale: Any = None
    if isinstance(value, Mapping):
        if "score" not in value:
            return math.nan, 'returned a dict without "score"', None
        value, rationale = value["score"], value.get("rationale")
    elif _is_feedback(value):
        if getattr(value, "error", None) is not None:
            return math.nan, f"the MLflow scorer failed: {_feedback_error(value)}", None
        value, rationale = value.value, getattr(value, "rationale", None)
    if isinstance(value, str) and value.strip().lower() in YES_NO:
        value = YES_NO[value.strip().lower()]
    number = _number(value)
    if number is None:
        what = "None (no score)" if value is None else type(value).__name__
        return math.nan, f'returned {what}, not a number, a bool or {{"score", "rationale"}}', None
    if rationale is not None and not isinstance(rationale, str):
        rationale = str(rationale)
    return number, None, secrets.scrub(rationale) if rationale else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool | np.bool_):
        return 1.0 if value else 0.0
    if isinstance(value, int | float | np.integer | np.floating):
        try:
            return float(value)
        except OverflowError:
            return math.inf
    return None


def _is_feedback(value: Any) -> bool:
    """An MLflow ``Feedback`` (what a scorer may return), told by its class without importing MLflow."""
    return type(value).__name__ == "Feedback" and hasattr(value, "value") and hasattr(value, "rationale")


def _feedback_error(value: Any) -> str:
    error = value.error
    text = getattr(error, "error_message", None) or getattr(error, "error_code", None) or str(error)
    return secrets.scrub(str(text)).splitlines()[0][:REASON_CHARS] if str(text) else "no reason given"


def _out_of_range(value: float, spec: MetricSpec) -> str:
    if math.isnan(value):
        return "returned NaN (no score)"
    high = "∞" if spec.high is None else f"{spec.high:g}"
    return f"returned {value:g}, outside its range [{spec.low:g}, {high}]"
