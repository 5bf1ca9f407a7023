"""``ragexp validate``: check a dataset without running anything; audit its labels against a
corpus, and its evidence against the documents; ask the configured system about its first case
(``--probe``); turn chunk-id gold into evidence (``--anchor``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragexp.config.compose import compose
from ragexp.config.models import MatchConfig, RagexpConfig
from ragexp.config.tracking import chosen_uri
from ragexp.conversations import check_history
from ragexp.datasets.audit import Finding, audit, load_chunks, shares_ids
from ragexp.datasets.evidence import Anchored, anchor_file, resolve_evidence, shares_documents
from ragexp.datasets.loader import Dataset, load_dataset, resolve_path
from ragexp.datasets.screening import refuse_unscreened
from ragexp.errors import ConfigError
from ragexp.metrics.cost import with_cost
from ragexp.metrics.custom import load_custom
from ragexp.metrics.registry import parse_metric_names
from ragexp.paths import data_roots
from ragexp.providers.base import Provider
from ragexp.providers.mapping import NEEDED
from ragexp.records import Case
from ragexp.secrets import mask_url
from ragexp.tracking.store import resolve_uri
from ragexp.workflows.run_plan import check_config, check_store_fields


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
    tracking_uri: str | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> DatasetCheck:
    """Load and check the configured dataset (or the file at ``path``); a broken one raises
    :class:`~ragexp.errors.DatasetErrors` listing every problem. ``tracking_uri``
    (``--tracking-uri``) and the config choose the store a run would log to, which the summary
    names (:mod:`ragexp.config.tracking`)."""
    config, file, file_format, corpus_file = _files(overrides, path, file_format, corpus)
    store = tracking_uri
    if config is not None:
        store = chosen_uri(tracking_uri, overrides, config.tracking.uri)
        check_store_fields(config)
    dataset = load_dataset(file, file_format)
    if not allow_draft:
        refuse_unscreened(dataset)
    chunks = load_chunks(corpus_file) if corpus_file is not None else None
    rule = config.dataset.match if config is not None else MatchConfig()
    documents = chunks
    if chunks is not None and corpus is None and path is None and not shares_documents(dataset, chunks):
        say(f"warning: evidence not checked: the configured corpus {corpus_file} holds none of the documents it names")
        documents = None
    dataset = resolve_evidence(dataset, documents, rule, corpus_key="--corpus" if corpus else "dataset.corpus")
    provider = None
    if config is not None:
        # What run checks before any work, so that validate says ok only where run would start.
        specs = with_cost(
            parse_metric_names(config.metrics.names, load_custom(config.metrics.custom).specs), config.cost
        )
        check_history(dataset.cases, config.conversation.history, str(dataset.path))
        provider = check_config(config, dataset, specs, concurrency=1)
    findings = None
    if chunks is not None:
        if corpus is None and path is None and not shares_ids(dataset, chunks.texts):
            say(f"warning: label audit skipped: the configured corpus {corpus_file} holds none of its relevant ids")
        else:
            findings = audit(dataset, chunks.texts)
    summary: dict[str, Any] = {
        "valid": True,
        "path": str(file),
        "format": dataset.format,
        "case_count": len(dataset.cases),
        "unanswerable": len(dataset.cases) - dataset.answerable_count,
        "dataset_hash": dataset.dataset_hash,
        "label_fields": present_labels(dataset),
        "output_fields": sorted(dataset.output_fields),
        "tracking_uri": mask_url(resolve_uri(store)),
        "human_labels": _human_counts(dataset.cases),
    }
    if dataset.has_evidence:
        evidence = [item for case in dataset.cases for item in case.relevant]
        summary["evidence"] = {
            "cases": sum(bool(case.relevant) for case in dataset.cases),
            "spans": len(evidence),
            "offsets": sum(item.start is not None for item in evidence),
            "checked_against": str(corpus_file) if documents is not None else None,
        }
    if findings is not None:
        summary["corpus"] = str(corpus_file)
        summary["findings"] = [finding.to_json() for finding in findings]
    if probe:
        if provider is None:
            raise ConfigError("--probe asks the configured system: it does not go with --path")
        summary["probe"] = probe_system(provider, dataset)
    return DatasetCheck(summary, findings)


def anchor_dataset(
    overrides: Sequence[str] = (),
    *,
    path: str | None = None,
    file_format: str = "auto",
    corpus: str | None = None,
    out: str | None = None,
    force: bool = False,
) -> Anchored:
    """``validate --anchor``: write the dataset with its chunk-id gold turned into evidence, from
    the chunk file's texts and document ids (``--corpus``, else the configured ``dataset.corpus``);
    an existing ``out`` is replaced only with ``force``."""
    if out is None:
        raise ConfigError("--anchor writes a new dataset: give it --out FILE")
    _, file, file_format, corpus_file = _files(overrides, path, file_format, corpus)
    if corpus_file is None:
        raise ConfigError(
            "--anchor reads the chunks the relevant ids name: give --corpus CHUNKS (JSONL of {id, text, doc})"
        )
    return anchor_file(load_dataset(file, file_format), load_chunks(corpus_file), Path(out), force=force)


def _files(
    overrides: Sequence[str], path: str | None, file_format: str, corpus: str | None
) -> tuple[RagexpConfig | None, Path, str, Path | None]:
    """(the composed config, or None with ``path``; the dataset file and its format; the corpus
    file: ``corpus``, else the configured ``dataset.corpus``)."""
    if path is not None:
        return None, resolve_path(path), file_format, resolve_path(corpus) if corpus else None
    config = compose(list(overrides))
    configured = corpus or config.dataset.corpus
    corpus_file = resolve_path(configured, data_roots()) if configured else None
    return config, resolve_path(config.dataset.path, data_roots()), config.dataset.format, corpus_file


def probe_system(provider: Provider, dataset: Dataset) -> dict[str, Any]:
    """One real request for the dataset's first case, or the first turn of its first
    conversation when it has any (``validate --probe``), read as a run reads it: an output the
    chosen metrics need that the reply does not give fails the probe, and so does a mapped
    conversation id the reply does not give."""
    provider.preflight(dataset)
    return provider.probe(next((case for case in dataset.cases if case.conversation is not None), dataset.cases[0]))


def _human_counts(cases: list[Case]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for case in cases:
        for name in case.human:
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def present_labels(dataset: Any) -> list[str]:
    """The label fields the file itself has: what the metrics can read (``label_fields``) without the
    other format's name for the question and without fields no case sets."""
    other = "user_input" if dataset.format == "jsonl" else "question"
    cases = dataset.cases
    unset = {
        "relevant_ids": not any(case.relevant_ids for case in cases),
        "unanswerable": not any(case.unanswerable for case in cases),
    }
    return sorted(name for name in dataset.label_fields if name != other and not unset.get(name, False))
