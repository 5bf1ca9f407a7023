"""``ragexp validate``: check a dataset without running anything; audit its labels against a
corpus; ask the configured system about its first case (``--probe``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ragexp.config.compose import compose
from ragexp.datasets.audit import Finding, audit, load_corpus, shares_ids
from ragexp.datasets.loader import Dataset, load_dataset, resolve_path
from ragexp.datasets.screening import refuse_unscreened
from ragexp.errors import ConfigError
from ragexp.metrics.registry import parse_metric_names
from ragexp.paths import data_roots
from ragexp.providers.base import Provider
from ragexp.providers.mapping import NEEDED
from ragexp.records import Case
from ragexp.runner import check_config, check_store_fields


@dataclass(frozen=True)
class DatasetCheck:
    summary: dict[str, Any]
    """What ``--json`` prints: the file, its counts, hash and fields; the audit's findings and
    the probe's report when asked for."""
    findings: list[Finding] | None
    """The label audit's findings (None: no audit)."""

    @property
    def probe_failed(self) -> bool:
        """The probe's call or reply failed, or an output the chosen metrics read was not found."""
        probe = self.summary.get("probe", {})
        return bool(probe.get("error")) or any(NEEDED in text for text in probe.get("missing", {}).values())


def check_dataset(
    overrides: Sequence[str] = (),
    *,
    path: str | None = None,
    file_format: str = "auto",
    corpus: str | None = None,
    probe: bool = False,
    allow_draft: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> DatasetCheck:
    """Load and check the configured dataset (or the file at ``path``); a broken one raises
    :class:`~ragexp.errors.DatasetErrors` listing every problem."""
    config = None
    if path is None:
        config = compose(list(overrides))
        check_store_fields(config)
        file, file_format = resolve_path(config.dataset.path, data_roots()), config.dataset.format
        configured = corpus or config.dataset.corpus
        corpus_file = resolve_path(configured, data_roots()) if configured else None
    else:
        file = resolve_path(path)
        corpus_file = resolve_path(corpus) if corpus else None
    dataset = load_dataset(file, file_format)
    if not allow_draft:
        refuse_unscreened(dataset)
    provider = None
    if config is not None:
        # What run checks before any work, so that validate says ok only where run would start.
        provider = check_config(config, dataset, parse_metric_names(config.metrics.names), concurrency=1)
    findings = None
    if corpus_file is not None:
        chunks = load_corpus(corpus_file)
        if corpus is None and path is None and not shares_ids(dataset, chunks):
            say(f"warning: label audit skipped: the configured corpus {corpus_file} holds none of its relevant ids")
        else:
            findings = audit(dataset, chunks)
    summary: dict[str, Any] = {
        "valid": True,
        "path": str(file),
        "format": dataset.format,
        "case_count": len(dataset.cases),
        "unanswerable": len(dataset.cases) - dataset.answerable_count,
        "dataset_hash": dataset.dataset_hash,
        "label_fields": sorted(dataset.label_fields),
        "output_fields": sorted(dataset.output_fields),
        "human_labels": _human_counts(dataset.cases),
    }
    if findings is not None:
        summary["corpus"] = str(corpus_file)
        summary["findings"] = [finding.to_json() for finding in findings]
    if probe:
        if provider is None:
            raise ConfigError("--probe asks the configured system: it does not go with --path")
        summary["probe"] = probe_system(provider, dataset)
    return DatasetCheck(summary, findings)


def probe_system(provider: Provider, dataset: Dataset) -> dict[str, Any]:
    """One real request for the dataset's first case (``validate --probe``), read as a run
    reads it: an output the chosen metrics need that the reply does not give fails the probe."""
    provider.preflight(dataset)
    return provider.probe(dataset.cases[0])


def _human_counts(cases: list[Case]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for case in cases:
        for name in case.human:
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))
