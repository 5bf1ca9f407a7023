"""``ragexp diff BASELINE CANDIDATE --attribute``: how much of each move comes from what the
candidate retrieved and how much from how it answered, measured by counterfactual replay.

Both runs' systems are rebuilt from their recorded ``config.yaml`` (secrets from the environment,
as for ``run``; a system whose config hash no longer matches the run's is refused). For each case
the 2×2 of retrieval {baseline, candidate} × generation {baseline, candidate} is completed: the
diagonal cells are the runs themselves; the swapped cells are the baseline's generator answering
from the candidate's retrieval (``candidate/baseline``) and the candidate's generator answering
from the baseline's (``baseline/candidate``). Only cases whose outputs differ are looked at, and
only those whose retrievals differ are replayed: a case with the same retrieval in both runs has
its swapped cells equal to the runs by construction. Each swapped cell is an ordinary run of the
generator's recorded config (its concurrency, retries, timeouts, judge and judge cache, error
rules), tagged ``ragexp.attribution.of=<candidate>`` and ``ragexp.attribution.cell=<retrieval>/
<generation>``. A replay that failed is an error for that case's attribution, never a 0.

A cell run also carries ``ragexp.attribution.inputs``, the hash of what it replays (the pair, the
cell, the generator's config hash, each replayed case and the retrieval it is given). Run again
for the same pair, ``--attribute`` takes the cell run with those inputs as ``run --resume`` would:
a finished one is reused as it is (no replay calls); an unfinished one (interrupted, stopped, or
left running by a dead process) is resumed through the runner's own resume, which keeps the
cases its checkpoint holds and asks only the others (and, as for ``run --resume``, the cases that
failed in transport); only when there is none is a new cell run started.

The statistics are :mod:`ragexp.stats.attribution`'s; this module runs systems, as
:mod:`ragexp.workflows.multirun` does.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ragexp import artifacts, limits, strict_json
from ragexp.compare.data import RunData, load_run
from ragexp.config.compose import validate
from ragexp.config.models import RagexpConfig
from ragexp.datasets.loader import dataset_hash
from ragexp.errors import ConfigError, RagexpError
from ragexp.metrics.population import covered
from ragexp.metrics.registry import MetricSpec
from ragexp.providers.base import OnResult, Provider, Retrieval, RunSettings, build_provider
from ragexp.records import Case, SystemOutput
from ragexp.stats.attribution import CAUSES, Cells, case_causes, decompose
from ragexp.tracking.records import RunRecord
from ragexp.tracking.store import FINISHED, TAG_PREFIX, Store, tag_filter

OF_TAG = TAG_PREFIX + "attribution.of"
CELL_TAG = TAG_PREFIX + "attribution.cell"
INPUTS_TAG = TAG_PREFIX + "attribution.inputs"
"""The hash of what a cell run replays (:func:`cell_inputs`): a rerun finds its cell run by it."""
BASELINE_TAG = TAG_PREFIX + "attribution.baseline"
ARTIFACT = artifacts.ATTRIBUTION
"""Kept on the candidate as ``comparisons/<baseline>/attribution.json``."""
ANSWER_OUTPUTS = frozenset({"response", "citations"})
"""Output fields of the answer stage: a metric reading one of them is split three ways."""
RETRIEVAL_OUTPUTS = frozenset({"retrieved_ids", "retrieved_contexts", "retrieved_doc_ids"})
"""A metric reading only these is retrieval's by definition."""
DEFINITION = (
    "2x2 factorial decomposition with the baseline as reference cell: retrieval = Y(candidate "
    "retrieval, baseline generation) - Y(baseline run); generation = Y(baseline retrieval, candidate "
    "generation) - Y(baseline run); interaction = total - retrieval - generation"
)
TOLERANCE = 1e-9

if TYPE_CHECKING:
    from ragexp.workflows.run_plan import Plan

Say = Callable[[str], None]


def _silent(line: str) -> None:
    pass


class CellProvider(Provider):
    """A swapped cell: ``generator``'s answer stage over the retrievals of the other run."""

    def __init__(self, generator: Provider, retrievals: dict[str, Retrieval]) -> None:
        super().__init__(generator.config, generator.settings)
        self.generator = generator
        self.retrievals = retrievals
        self.remote = generator.remote

    def run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        self.generator.generate(cases, [self.retrievals[case.id] for case in cases], on_result)


@dataclass
class System:
    """One run's system, rebuilt from its recorded config and planned as ``run`` plans it."""

    run: RunData
    config: RagexpConfig
    plan: Plan


def rebuilt_config(store: Store, data: RunData, role: str) -> RagexpConfig:
    """The run's recorded config, validated; a run without one cannot be replayed."""
    import yaml

    try:
        raw = yaml.safe_load(store.read_artifact(data.run_id, artifacts.CONFIG))
    except RagexpError as exc:
        raise ConfigError(f"--attribute: the {role} run {data.run_id} has no readable config.yaml ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--attribute: the {role} run {data.run_id}'s config.yaml is not a mapping")
    return validate(raw)


def check_can_generate(store: Store, baseline: RunData, candidate: RunData) -> tuple[RagexpConfig, RagexpConfig]:
    """Both runs' configs, once each system is known to answer from given contexts; else one
    line naming the run and what its system lacks. Runs no system."""
    configs = []
    for role, data in (("baseline", baseline), ("candidate", candidate)):
        if data.conversations is not None:
            # A swapped cell would ask each turn alone, without the turns before it: what it
            # measured would be another conversation than the runs'.
            chats = len({chat for chat in data.conversations if chat is not None})
            raise ConfigError(
                f"--attribute: the {role} run {data.run_id} holds conversations ({chats}): a turn cannot be "
                "replayed without the turns before it; compare them without --attribute"
            )
        config = rebuilt_config(store, data, role)
        settings = RunSettings(config.k, config.concurrency, config.dataset)
        missing = build_provider(config.provider.system, settings).generation_missing()
        if missing is not None:
            raise ConfigError(
                f"--attribute: the {role}'s system (run {data.run_id}, provider {config.provider.name}) cannot "
                f"answer from given contexts: {missing}"
            )
        configs.append(config)
    return configs[0], configs[1]


def _plan(store: Store, data: RunData, config: RagexpConfig, role: str) -> System:
    from ragexp.workflows.run_plan import plan_run

    plan = plan_run(config, store.state_dir())
    recorded = data.record.tag("config_hash")
    if plan.config_hash != recorded:
        raise ConfigError(
            f"--attribute: the {role}'s system is not the one run {data.run_id} measured (config hash "
            f"{plan.config_hash[:12]} now, {recorded[:12]} recorded: its code, documents or dataset changed)"
        )
    return System(data, config, plan)


def _kind(spec: MetricSpec | None) -> str | None:
    """``answer`` (split three ways), ``retrieval`` (retrieval's by definition) or None (not
    attributed: run-level figures, latency, errors)."""
    if spec is None or not spec.per_case or not spec.mean_of_cases or spec.case_values != "score":
        return None
    if spec.needs_output & ANSWER_OUTPUTS:
        return "answer"
    if spec.needs_output and spec.needs_output <= RETRIEVAL_OUTPUTS:
        return "retrieval"  # a judge's context metrics too: they read what was retrieved alone
    return None


def _same_output(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("ranked_ids", "contexts", "answer", "citations")
    return all(a.get(key) == b.get(key) for key in keys)


@dataclass
class Attribution:
    """What ``--attribute`` measured (its JSON is :meth:`to_json`)."""

    metrics: list[dict[str, Any]]
    cases: list[dict[str, Any]]
    errors: list[dict[str, str]]
    replayed: int
    cells: dict[str, str] = field(default_factory=dict)
    """Cell (``<retrieval>/<generation>``) -> the run that holds its replays."""
    confidence: float = 0.95

    def to_json(self) -> dict[str, Any]:
        return {
            "definition": DEFINITION,
            "confidence": self.confidence,
            "metrics": self.metrics,
            "cases": self.cases,
            "errors": self.errors,
            "replayed": self.replayed,
            "cells": self.cells,
        }


def attribute(
    store: Store,
    baseline: RunData,
    candidate: RunData,
    configs: tuple[RagexpConfig, RagexpConfig],
    *,
    resamples: int,
    confidence: float,
    seed: int,
    say: Say = _silent,
) -> Attribution:
    """Replay the swapped cells of the cases whose retrieval differs and split each metric's
    paired delta; ``configs`` come from :func:`check_can_generate`."""
    base = _plan(store, baseline, configs[0], "baseline")
    cand = _plan(store, candidate, configs[1], "candidate")
    shared_ids = set(candidate.case_ids)
    ids = [case_id for case_id in baseline.case_ids if case_id in shared_ids]
    b_run, c_run = baseline.select(ids), candidate.select(ids)
    cases = {case.id: case for case in base.plan.dataset.cases}
    errors: dict[str, str] = {}
    to_replay: list[str] = []
    b_found: dict[str, Retrieval] = {}
    c_found: dict[str, Retrieval] = {}
    unchanged: set[str] = set()
    for position, case_id in enumerate(ids):
        b_row, c_row = b_run.row(position), c_run.row(position)
        b_out, c_out = b_row.get("output"), c_row.get("output")
        if b_out is None or c_out is None:
            which = "baseline" if b_out is None else "candidate"
            errors[case_id] = (
                f"the {which} run has no output for this case ({b_row.get('error') or c_row.get('error')})"
            )
            continue
        if _same_output(b_out, c_out):
            unchanged.add(case_id)
            continue
        case = cases.get(case_id)
        if case is None:
            errors[case_id] = "the case is not in the baseline's dataset as it reads now"
            continue
        b_found[case_id] = base.plan.provider.retrieval(case, SystemOutput.from_json(b_out))
        c_found[case_id] = cand.plan.provider.retrieval(case, SystemOutput.from_json(c_out))
        if b_found[case_id] != c_found[case_id]:  # the same retrieval: the swapped cells are the runs
            to_replay.append(case_id)
    cell_scores: dict[str, RunData] = {}
    cell_runs: dict[str, str] = {}
    if to_replay:
        say(f"attribution: {len(to_replay)} cases whose retrieval differs, each in 2 swapped cells")
        for cell, generator, retrievals in (
            ("candidate/baseline", base, c_found),
            ("baseline/candidate", cand, b_found),
        ):
            run_id, data, why = _replay(
                store,
                generator,
                {case_id: retrievals[case_id] for case_id in to_replay},
                [cases[i] for i in to_replay],
                cell,
                (baseline.run_id, candidate.run_id),
                say,
            )
            cell_runs[cell] = run_id
            if data is None:
                for case_id in to_replay:
                    errors.setdefault(case_id, f"every replay of cell {cell} failed (run {run_id}): {why}")
            else:
                cell_scores[cell] = data
                for position, case_id in enumerate(data.case_ids):
                    if data.errored[position]:
                        row = data.row(position)
                        reason = row.get("error") or "; ".join(
                            f"{k}: {v}" for k, v in (row.get("metric_errors") or {}).items()
                        )
                        errors.setdefault(case_id, f"replay of cell {cell} failed: {reason}")
    metrics, cells_of = _decomposed(b_run, c_run, ids, cell_scores, set(errors), resamples, confidence, seed)
    answer_cells = [cells_of[m["name"]] for m in metrics if not m["by_definition"]]
    causes = case_causes(answer_cells)
    listed = []
    for position, case_id in enumerate(ids):
        cause = causes[position] if causes else None
        if cause is None:
            continue
        values = {
            m["name"]: {
                cell: _value(getattr(cells_of[m["name"]], attr)[position])
                for cell, attr in (
                    ("baseline", "bb"),
                    ("candidate/baseline", "cb"),
                    ("baseline/candidate", "bc"),
                    ("candidate", "cc"),
                )
            }
            for m in metrics
            if not m["by_definition"]
        }
        listed.append({"id": case_id, "cause": cause, "replayed": case_id in to_replay, "metrics": values})
    listed.sort(key=lambda row: CAUSES.index(row["cause"]))
    return Attribution(
        metrics,
        listed,
        [{"id": case_id, "error": text} for case_id, text in errors.items()],
        len(to_replay),
        cell_runs,
        confidence,
    )


def _value(value: float) -> float | None:
    return None if not np.isfinite(value) else float(value)


def cell_inputs(generator: System, cell: str, pair: tuple[str, str], retrievals: dict[str, Retrieval]) -> str:
    """The hash of what a cell run replays: the pair, the cell, the generator's config hash, and
    each replayed case with the retrieval it is given, in order."""
    given = [
        [case_id, list(found.ranked_ids), list(found.contexts), list(found.doc_ids), found.score]
        for case_id, found in retrievals.items()
    ]
    payload = {"pair": list(pair), "cell": cell, "generator": generator.plan.config_hash, "given": given}
    return hashlib.sha256(strict_json.dumps(payload).encode("utf-8", "surrogatepass")).hexdigest()


def earlier_cell(store: Store, experiment: str, of: str, cell: str, inputs: str) -> RunRecord | None:
    """The cell run an earlier ``--attribute`` of the pair made with these inputs: a finished one
    first, else the newest unfinished one; None when there is none."""
    tags = ((OF_TAG, of), (CELL_TAG, cell), (INPUTS_TAG, inputs))
    clause = " and ".join(tag_filter(key, value) for key, value in tags)
    found = store.search(experiment, limit=100, filter_string=clause)  # newest first
    return next((run for run in found if run.status == FINISHED), found[0] if found else None)


def _replay(
    store: Store,
    generator: System,
    retrievals: dict[str, Retrieval],
    cases: list[Case],
    cell: str,
    pair: tuple[str, str],
    say: Say,
) -> tuple[str, RunData | None, str]:
    """One swapped cell as a run of the generator's config over the replayed cases: the earlier
    one with the same inputs reused when finished, resumed when not, else a new one. No data
    when every replay errored, and then why (the first error, as ``run`` words it)."""
    from ragexp.errors import AllCasesErrored, Stopped
    from ragexp.workflows.run import execute

    plan = generator.plan
    of = pair[1]
    name = limits.fit(limits.RUN_NAME, f"attribution {cell} of {of}")
    config = plan.config.model_copy(update={"run_name": name})
    inputs = cell_inputs(generator, cell, pair, retrievals)
    earlier = earlier_cell(store, config.experiment, of, cell, inputs)
    if earlier is not None and earlier.status == FINISHED:
        say(
            f"attribution: cell {cell}: run {earlier.run_id} replayed these {len(cases)} cases with the same inputs "
            "before: reused as it is (no replay calls)"
        )
        return earlier.run_id, load_run(store, earlier), ""
    cell_plan = dataclasses.replace(
        plan,
        config=config,
        provider=CellProvider(plan.provider, retrievals),
        # The cell holds the replayed cases only, and its hashes say so.
        dataset=dataclasses.replace(
            plan.dataset,
            cases=cases,
            dataset_hash=dataset_hash(cases),
            cases_hash=dataset_hash(cases, human=False) if any(case.human for case in cases) else dataset_hash(cases),
        ),
    )
    resume = earlier.run_id if earlier is not None else None
    if earlier is not None:
        how = earlier.tag("status") or earlier.status.lower()
        say(f"attribution: cell {cell}: continuing run {earlier.run_id} ({how}), as run --resume does")
    else:
        say(f"attribution: cell {cell}: replaying {len(cases)} cases in a new run")
    tags = {OF_TAG: of, CELL_TAG: cell, INPUTS_TAG: inputs, BASELINE_TAG: pair[0]}
    try:
        outcome = execute(cell_plan, store, resume=resume, tags=tags)
    except AllCasesErrored as exc:
        return exc.outcome.run_id, None, str(exc)
    except Stopped as exc:
        exc.args = (f"attribution cell {cell}: {exc}",)
        raise
    return outcome.run_id, load_run(store, outcome.run_id), ""


def _decomposed(
    b_run: RunData,
    c_run: RunData,
    ids: list[str],
    cell_scores: dict[str, RunData],
    errored: set[str],
    resamples: int,
    confidence: float,
    seed: int,
) -> tuple[list[dict[str, Any]], dict[str, Cells]]:
    out: list[dict[str, Any]] = []
    cells_of: dict[str, Cells] = {}
    bad = np.array([case_id in errored for case_id in ids], dtype=bool)
    for name in b_run.metrics:
        spec = c_run.spec(name) or b_run.spec(name)
        kind = _kind(spec)
        if kind is None or name not in b_run.scores or name not in c_run.scores or spec is None:
            continue
        bb, cc = b_run.scores[name].copy(), c_run.scores[name].copy()
        if kind == "retrieval":
            cb, bc = cc.copy(), bb.copy()  # a retrieval metric reads the retrieval alone
        else:
            # Unchanged cases: every cell is the runs' value; the same retrieval: the swapped
            # cells are the runs themselves; replayed cases: the cell runs' values.
            cb, bc = bb.copy(), cc.copy()
            for cell, target in (("candidate/baseline", cb), ("baseline/candidate", bc)):
                data = cell_scores.get(cell)
                if data is None:
                    continue
                position = {case_id: i for i, case_id in enumerate(data.case_ids)}
                values = data.scores.get(name)
                for i, case_id in enumerate(ids):
                    if case_id in position:
                        target[i] = values[position[case_id]] if values is not None else np.nan
        keep = ~bad & covered(spec, b_run.unanswerable)  # the metric's one population rule
        nan = np.where(keep, 0.0, np.nan)
        cells = Cells(bb + nan, cb + nan, bc + nan, cc + nan)
        cells_of[name] = cells
        found = decompose(cells, resamples=resamples, confidence=confidence, seed=seed)
        row: dict[str, Any] = {"name": name, "by_definition": kind == "retrieval"}
        if found is None:
            row.update(cases=0, total=None, retrieval=None, generation=None, interaction=None)
            row.update(total_ci=None, retrieval_ci=None, generation_ci=None, interaction_ci=None)
        else:
            row.update(
                cases=found.n,
                total=found.total,
                retrieval=found.retrieval,
                generation=found.generation,
                interaction=found.interaction,
                total_ci=list(found.total_ci),
                retrieval_ci=list(found.retrieval_ci),
                generation_ci=list(found.generation_ci),
                interaction_ci=list(found.interaction_ci),
            )
        out.append(row)
    return out, cells_of
