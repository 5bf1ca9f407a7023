"""``ragexp shadow``: a candidate answers the questions production traffic asked, and the two are
compared by stratum.

The sample is read once (:mod:`ragexp.workflows.traffic`) and serves two runs: the **production** run
replays what production answered and retrieved (``system=replay`` over the traces' outputs),
the **candidate** run asks the configured system the same questions (conversations turn by turn,
each after its own history). Both are judged with the configured metrics (those that need no
gold: a sample of traffic has none) by the same judge, so ``diff``, ``gate`` and ``report`` work
on the pair as on any pair. Both runs and their traces go to the shadow experiment (default
``<production experiment>-shadow``), tagged ``ragexp.shadow``: nothing is written to the
production experiment. The comparison by stratum (:mod:`ragexp.stats.strata`) is logged on the
candidate as ``shadow.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragexp import artifacts, strict_json
from ragexp.compare.data import RunData, load_run
from ragexp.compare.shadow_pair import PAIR_TAG, compare_pair, is_pair, traffic_strata
from ragexp.config.compose import compose
from ragexp.config.models import RagexpConfig, ReplaySystemConfig
from ragexp.config.tracking import chosen_uri
from ragexp.errors import ConfigError
from ragexp.labels.collect import calibration_settings, collect_labels
from ragexp.progress import Phase
from ragexp.secrets import register_url
from ragexp.stats.strata import MetricStrata
from ragexp.tracking.review_queues import LABEL_TAG
from ragexp.tracking.store import TAG_PREFIX, Store
from ragexp.workflows.run import RunOutcome, execute
from ragexp.workflows.run_plan import plan_run
from ragexp.workflows.sequential import SequentialOutcome, execute_until_decided
from ragexp.workflows.traffic import Traffic, load_traffic

SHADOW_TAG = TAG_PREFIX + "shadow"
"""On both runs of a shadow: the production experiment the traffic was read from."""
ROLE_TAG = TAG_PREFIX + "shadow.role"
"""``production`` (the replay of what production answered) or ``candidate``."""
WORST_TAG = TAG_PREFIX + "shadow.worst_stratum"
"""On the candidate: the stratum with the largest credible regression of the first metric."""
SHADOW_ARTIFACT = artifacts.SHADOW
SUFFIX = "-shadow"


@dataclass(frozen=True)
class ShadowOutcome:
    experiment: str
    """Where the two runs were written."""
    traffic: Traffic
    production: RunOutcome
    candidate: RunOutcome
    metrics: list[MetricStrata]
    sequential: SequentialOutcome | None = None
    """The candidate's decision with ``--until-decided`` (None: every case asked)."""

    @property
    def worst(self) -> str | None:
        """The stratum with the largest credible regression, in the first metric that has one."""
        return next((metric.worst for metric in self.metrics if metric.worst is not None), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "production": self.production.to_json(),
            "candidate": self.candidate.to_json(),
            "traffic": self.traffic.to_json(),
            "metrics": [metric.to_json() for metric in self.metrics],
            "worst_stratum": self.worst,
            **({"sequential": self.sequential.to_json()} if self.sequential is not None else {}),
        }


def shadow_experiment(production: str, given: str | None) -> str:
    """Where a shadow of ``production`` is written; never the production experiment itself."""
    name = given or production + SUFFIX
    if name == production:
        raise ConfigError(f"--experiment: {name!r} is the production experiment; a shadow never writes there")
    return name


def production_config(config: RagexpConfig, experiment: str) -> RagexpConfig:
    """The candidate's config with production's recorded outputs as its system."""
    provider = config.provider.model_copy(
        update={"name": "production", "system": ReplaySystemConfig.model_validate({"kind": "replay"})}
    )
    return config.model_copy(update={"provider": provider, "experiment": experiment})


def run_shadow(
    overrides: Sequence[str],
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    until_decided: bool = False,
) -> ShadowOutcome:
    """Read the traffic ``dataset.experiment`` names, run production's replay and the candidate
    on it, and compare them by stratum. ``until_decided``: the candidate is asked batch by batch
    (a warm-up of every stratum, then the stratum nearest to failing) until its gate against
    production is decided by stratum; the strata are then compared on the cases it was asked."""
    config = compose(list(overrides))
    if config.dataset.experiment is None:
        raise ConfigError(
            "ragexp shadow replays production traffic: add dataset=traces dataset.experiment=NAME "
            "(the MLflow experiment holding production's traces)"
        )
    target = shadow_experiment(config.dataset.experiment, experiment)
    uri = chosen_uri(tracking_uri, overrides, config.tracking.uri)
    store = Store(uri, timeout_s=config.tracking.timeout_s)
    register_url(store.uri)
    candidate_config = config.model_copy(update={"experiment": target})
    with Phase("reading production traffic", enabled=config.progress):
        traffic = load_traffic(config.dataset, store)
    baseline_config = production_config(candidate_config, target)
    base_plan = plan_run(baseline_config, store.state_dir(), traffic=traffic)
    cand_plan = plan_run(candidate_config, store.state_dir(), traffic=traffic)
    shadow = {SHADOW_TAG: config.dataset.experiment}
    production = execute(base_plan, store, tags={**shadow, ROLE_TAG: "production"})
    candidate_tags = {**shadow, ROLE_TAG: "candidate", PAIR_TAG: production.run_id}
    sequential = None
    if until_decided:
        decided = execute_until_decided(cand_plan, store, production.run_id, tags=candidate_tags)
        candidate, sequential = decided.evaluation.outcome, decided.sequential
    else:
        candidate = execute(cand_plan, store, tags=candidate_tags)
    metrics = compare_strata(store, production.run_id, candidate.run_id, traffic, config)
    outcome = ShadowOutcome(target, traffic, production, candidate, metrics, sequential)
    files = {SHADOW_ARTIFACT: strict_json.dumps(outcome.to_json(), indent=1).encode()}
    store.log_files(candidate.run_id, files)
    if outcome.worst is not None:
        store.set_tags(candidate.run_id, {WORST_TAG: outcome.worst})
    return outcome


def compare_strata(
    store: Store, production: str, candidate: str, traffic: Traffic, config: RagexpConfig
) -> list[MetricStrata]:
    """Every metric both runs scored, compared overall and per stratum of the traffic."""
    gates = config.gates
    return compare_pair(
        load_run(store, production),
        load_run(store, candidate),
        traffic.strata,
        confidence=gates.confidence,
        resamples=gates.resamples,
        seed=gates.seed,
    )


def people_labels(store: Store, run: RunData) -> dict[str, np.ndarray]:
    """Metric -> (n,) people's scores of the run's cases, NaN where unlabelled; read only from a
    run ``ragexp label`` queued (reading every trace of an unlabelled run finds nothing)."""
    if not run.record.tag(LABEL_TAG):
        return {}
    return collect_labels(store, run).human


def pair_strata(
    store: Store, baseline: RunData, candidate: RunData, *, confidence: float, resamples: int, seed: int
) -> list[MetricStrata] | None:
    """A shadow pair compared by stratum with people's labels (None: not a shadow pair), for
    ``diff`` and ``report``."""
    if not is_pair(baseline, candidate):
        return None
    return compare_pair(
        baseline,
        candidate,
        traffic_strata(store, candidate.run_id),
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        human=(people_labels(store, baseline), people_labels(store, candidate)),
        min_labelled=calibration_settings(candidate).min_labelled,
    )
