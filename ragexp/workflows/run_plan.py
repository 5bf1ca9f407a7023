"""``ragexp run``, first step: the plan. Everything that can be wrong with the input is found in
:func:`plan_run`, before an MLflow run exists, so bad input never leaves a half-written run behind."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ragexp import __version__, limits
from ragexp.config.compose import metric_sets
from ragexp.config.identity import config_hash, run_params
from ragexp.config.models import RagexpConfig
from ragexp.conversations import check_history
from ragexp.datasets.audit import Finding, audit, load_chunks, shares_ids
from ragexp.datasets.evidence import resolve_evidence, shares_documents
from ragexp.datasets.loader import Dataset, load_dataset, only_cases, resolve_path
from ragexp.errors import (
    ConfigError,
    MetricError,
    RagexpError,
)
from ragexp.metrics.canaries import Canaries, load_canaries
from ragexp.metrics.cost import check_prices, with_cost
from ragexp.metrics.custom import CustomMetrics, load_custom
from ragexp.metrics.registry import MetricSpec, parse_metric_names, with_hop_metrics, with_stream_metrics
from ragexp.metrics.requirements import can_score, check_evidence, check_requirements, needed_outputs
from ragexp.outputs import info
from ragexp.paths import data_roots, packaged_trees
from ragexp.providers.base import Provider, RunSettings, build_provider
from ragexp.secrets import holds, scrub
from ragexp.tracking.store import TAG_PREFIX, Store
from ragexp.workflows.traffic import Traffic, load_traffic

if TYPE_CHECKING:
    from ragexp.metrics.judge.scorer import Judging


SHORT_HASH = 12
"""Characters of the config hash the CLI prints, tags and searches by."""


@dataclass
class Plan:
    """A validated run, ready to execute."""

    config: RagexpConfig
    dataset: Dataset
    specs: list[MetricSpec]
    provider: Provider
    config_hash: str
    judge: str
    """Judge identity (``none`` without judge metrics)."""
    scorer: Judging | None = None
    findings: list[Finding] | None = None
    """Label audit against ``dataset.corpus`` (None: no corpus configured)."""
    custom: CustomMetrics = field(default_factory=CustomMetrics)
    """The metrics of ``metrics.custom``, their Python functions loaded (their specs are in ``specs`` too)."""
    canaries: Canaries | None = None
    """``judge.canaries``, read and checked (None: none configured, or no judge metric)."""
    traffic: Traffic | None = None
    """What reading production traces found (``dataset=traces``); None for a dataset file."""

    def run_name(self) -> str:
        """The configured name, else the short config hash, then provider, dataset and k (the end
        cut if the names are long). The hash comes first: the MLflow UI's run lists show only a
        name's first few characters, and two runs of one system differ in their hash alone."""
        cfg = self.config
        if cfg.run_name:
            return cfg.run_name
        return f"{self.config_hash[:SHORT_HASH]}-{cfg.provider.name}-{cfg.dataset.name}-k{cfg.k}"[
            : limits.RUN_NAME.chars
        ]

    def tags(self) -> dict[str, str]:
        cfg = self.config
        audit = {} if self.findings is None else {TAG_PREFIX + "audit.findings": str(len(self.findings))}
        if self.traffic is not None:
            audit[TAG_PREFIX + "traffic.experiment"] = self.traffic.experiment
            audit[TAG_PREFIX + "traffic.unreadable"] = str(len(self.traffic.unreadable))
        return {
            **audit,
            TAG_PREFIX + "cases_hash": self.dataset.cases_hash,
            TAG_PREFIX + "config_hash": self.config_hash,
            TAG_PREFIX + "config_hash_short": self.config_hash[:SHORT_HASH],
            TAG_PREFIX + "dataset_hash": self.dataset.dataset_hash,
            TAG_PREFIX + "dataset": cfg.dataset.name,
            TAG_PREFIX + "provider": cfg.provider.name,
            TAG_PREFIX + "metrics": ",".join(spec.name for spec in self.specs),
            TAG_PREFIX + "metric_set": cfg.metrics.set,
            TAG_PREFIX + "k": str(cfg.k),
            TAG_PREFIX + "judge": self.judge,
            TAG_PREFIX + "case_count": str(len(self.dataset.cases)),
            TAG_PREFIX + "version": __version__,
            # The language the cases' rationales are written in (report.language), for readers
            # that print them in a language of their own.
            TAG_PREFIX + "language": cfg.report.language,
        }


def plan_run(
    config: RagexpConfig, state_dir: Path | None = None, *, store: Store | None = None, traffic: Traffic | None = None
) -> Plan:
    """Load and check everything a run needs; raises a RagexpError on any bad input.

    ``state_dir`` holds the judge's cache and adapted prompts (the tracking store's folder).
    With ``dataset.experiment`` the cases are that experiment's traces, read from ``store`` (else
    the configured one), unless ``traffic`` gives them already read (a shadow's two runs share one
    sample).
    """
    custom = load_custom(config.metrics.custom)
    specs = with_cost(parse_metric_names(config.metrics.names, custom.specs), config.cost)
    check_store_fields(config)
    if config.dataset.experiment is not None and traffic is None:
        traffic = load_traffic(config.dataset, store or Store(config.tracking.uri, timeout_s=config.tracking.timeout_s))
        info(traffic.describe())
    if traffic is not None:
        dataset = traffic.dataset
    else:
        dataset = load_dataset(resolve_path(config.dataset.path, data_roots()), config.dataset.format)
    if config.dataset.case_ids is not None:
        dataset = only_cases(dataset, config.dataset.case_ids)
    corpus = None
    if config.dataset.corpus is not None:
        corpus = load_chunks(resolve_path(config.dataset.corpus, data_roots()))
    documents = corpus
    if corpus is not None and not shares_documents(dataset, corpus):
        info(f"warning: evidence not checked: the configured corpus {corpus.path} holds none of the documents it names")
        documents = None
    dataset = resolve_evidence(dataset, documents, config.dataset.match, corpus_key="dataset.corpus")
    check_history(dataset.cases, config.conversation.history, str(dataset.path))
    provider = check_config(config, dataset, specs)
    check_no_secret_names(config)  # the system's secrets are read: before it is contacted
    specs = with_stream_metrics(specs, provider.output_fields(dataset))
    specs = with_hop_metrics(specs, dataset.hop_count, provider.output_fields(dataset))
    if dataset.hop_count and not any(spec.hop for spec in specs):
        info(
            f"warning: the cases of {config.dataset.name} give gold per hop, and provider {config.provider.name} "
            "reports no retrieval calls (response.retrievals): only the case-level metrics are scored"
        )
    provider.preflight(dataset)
    scorer, judge = None, "none"
    if any(spec.judge for spec in specs) and config.provider.judge is not None:
        from ragexp.metrics.judge.scorer import JudgeScorer

        scorer = JudgeScorer(config.provider.judge, specs, state_dir or Path("mlruns"), warn=info)
        scorer.preflight()
        judge = scorer.identity
        limits.check(limits.TAG_VALUE, judge, "provider.judge (its identity, the ragexp.judge tag)")
    findings = None
    # A corpus sharing no id with the cases belongs to another set (a dataset.path override under
    # a group that names its corpus): no audit, rather than one finding per case.
    if corpus is not None and shares_ids(dataset, corpus.texts):
        findings = audit(dataset, corpus.texts)
    canaries = None
    if scorer is not None and config.provider.judge is not None and config.provider.judge.canaries:
        canaries = load_canaries(config.provider.judge.canaries)
    check_no_secret_names(config)  # and the judge's
    digest = config_hash(config, dataset.file_sha256, judge, provider.identity(), custom.identities())
    return Plan(config, dataset, specs, provider, digest, judge, scorer, findings, custom, canaries, traffic)


def check_config(
    config: RagexpConfig, dataset: Dataset, specs: Sequence[MetricSpec], *, concurrency: int | None = None
) -> Provider:
    """Every check of a run's config against its dataset that contacts nothing and runs no
    code of the system (``run`` makes them, and ``validate`` without ``--probe``): a judge for
    the judge metrics, the system's own config (expressions, templates, secrets, files), and
    each metric's fields against what the dataset and the system give. The provider it built."""
    judge_specs = [spec for spec in specs if spec.judge]
    if judge_specs and config.provider.judge is None:
        first = judge_specs[0]
        who = f"{first.custom.key}: the rubric '{first.name}'" if first.custom else f"metric '{first.name}'"
        raise MetricError(
            f"{who} needs an LLM judge, and provider {config.provider.name} has none "
            "(use provider=npu, provider=replay_judge or provider=http_judge, or set provider.judge)"
        )
    settings = RunSettings(
        k=config.k,
        concurrency=config.concurrency if concurrency is None else concurrency,
        dataset=config.dataset,
        outputs=needed_outputs(specs),
    )
    provider = build_provider(config.provider.system, settings)
    outputs = provider.output_fields(dataset)
    if dataset.has_evidence:
        outputs = check_evidence(
            specs, dataset.cases, outputs, dataset=config.dataset.name, provider=config.provider.name
        )
    try:
        check_requirements(
            specs, dataset.label_fields, outputs, dataset=config.dataset.name, provider=config.provider.name
        )
    except MetricError as exc:
        fit = metrics_that_fit(config, specs, dataset.label_fields, outputs)
        raise MetricError(f"{exc}{fit}{datasets_that_fit(config, specs, provider)}") from None
    check_prices(
        config.cost,
        reports_usage=provider.reports_usage(),
        judged=bool(judge_specs),
        provider=config.provider.name,
    )
    provider.check(dataset)
    return provider


def metrics_that_fit(
    config: RagexpConfig, specs: Sequence[MetricSpec], labels: frozenset[str], outputs: frozenset[str]
) -> str:
    """The fix for a metric set the dataset or system cannot be scored on: the named sets that
    fit, and the chosen metrics that do."""
    judged = config.provider.judge is not None

    def fits(chosen: Sequence[MetricSpec]) -> bool:
        return all(can_score(spec, labels, outputs) and (judged or not spec.judge) for spec in chosen)

    unfit_own = [spec for spec in specs if spec.custom is not None and not fits([spec])]
    if unfit_own:  # a named set would not help: the metric of the user's is what cannot be scored
        return f"; leave {unfit_own[0].custom.key} out of metrics.custom for this system"  # type: ignore[union-attr]
    ways = []
    for name, names in metric_sets().items():
        try:
            if fits(parse_metric_names(list(names))):
                ways.append(f"metrics={name}")
        except MetricError:
            continue
    kept = [spec.name for spec in specs if fits([spec]) and spec.custom is None]
    if kept and len(kept) < len(specs):
        ways.append(f"metrics.names=[{','.join(kept)}]")
    return f"; metrics that fit: {' or '.join(ways)}" if ways else ""


def datasets_that_fit(config: RagexpConfig, specs: Sequence[MetricSpec], provider: Provider) -> str:
    """The other fix, when the dataset is one of the bundled ones: the other bundled datasets
    (``dataset/`` options) on which this system can score every chosen metric, e.g. for a
    replaying preset on the default set, which records no outputs."""
    import yaml

    trees = packaged_trees()
    if not any((tree / "dataset" / f"{config.dataset.name}.yaml").is_file() for tree in trees):
        return ""  # a set of the user's own: a bundled sample set is no fix for it
    judged = config.provider.judge is not None
    ways = []
    for tree in trees:
        for option in sorted((tree / "dataset").glob("*.yaml")):
            try:
                group = yaml.safe_load(option.read_text(encoding="utf-8"))
                if group.get("name") == config.dataset.name:
                    continue
                other = load_dataset(resolve_path(group["path"], data_roots()), group.get("format", "auto"))
                outputs, labels = provider.output_fields(other), other.label_fields
                if not all(can_score(spec, labels, outputs) and (judged or not spec.judge) for spec in specs):
                    continue
                provider.check(other)
            except (RagexpError, OSError, KeyError, AttributeError, yaml.YAMLError):
                continue  # a dataset that cannot be read or scored here is no fix
            ways.append(f"dataset={option.stem}")
    return f"; datasets that fit: {' or '.join(ways)}" if ways else ""


def check_store_fields(config: RagexpConfig) -> None:
    """Refuse, naming the config key, every configured value an MLflow store would refuse as
    the run's experiment, name, tags, params or dataset name (before anything is evaluated)."""
    limits.check(limits.EXPERIMENT_NAME, config.experiment, "experiment")
    if config.run_name:
        limits.check(limits.RUN_NAME, config.run_name, "run_name")
    limits.check(limits.DATASET_NAME, config.dataset.name, "dataset.name")
    for key, value in config.tags.items():
        limits.check(limits.TAG_KEY, key, f"tags.{key} (the tag's name)")
        limits.check(limits.TAG_VALUE, str(value), f"tags.{key}")
    for name, text in {"provider.name": config.provider.name, "metrics.set": config.metrics.set}.items():
        limits.check(limits.TAG_VALUE, text, name)
    for key, value in run_params(config).items():
        limits.check(limits.PARAM_KEY, key, f"{key} (an MLflow param name)")
        # Longer values are cut to the param's length when logged (the config.yaml artifact has them whole).
        limits.check(limits.PARAM_VALUE, value[: limits.PARAM_VALUE.chars], key)


def check_no_secret_names(config: RagexpConfig) -> None:
    """Refuse an experiment name that holds a secret's value (``${oc.env:...}`` of a variable the
    config also reads as a credential): masked it would merge with other experiments, in clear it
    would show the secret on every page. Called once the secrets are read (the system built, the
    judge built); everything else a run records is masked instead."""
    if holds(config.experiment):
        raise ConfigError(
            f"experiment: {scrub(config.experiment)!r} holds the value of a secret this config reads "
            "from the environment (*** above); name the experiment without it"
        )
