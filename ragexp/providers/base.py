"""The provider interface and its registry."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ragexp.config.models import DatasetConfig, SystemConfig
from ragexp.conversations import Turns
from ragexp.datasets.loader import OUTPUT_FIELDS, Dataset
from ragexp.errors import ConfigError, ProviderError
from ragexp.records import Case, CaseResult, SystemOutput

OnResult = Callable[[int, CaseResult], None]
"""Called once per case as it completes, with the case's index in the input order."""


@dataclass(frozen=True)
class RunSettings:
    """What every provider may need besides its own config."""

    k: int
    concurrency: int
    dataset: DatasetConfig
    outputs: frozenset[str] | None = None
    """The output fields the run's metrics read (``retrieved_ids``, ``citations``, ...): an
    output among them that a reply does not give is an error for that case. None: every one."""


@dataclass(frozen=True)
class Retrieval:
    """What a system's retrieval stage gave for one case: what its answer stage reads."""

    ranked_ids: tuple[str, ...]
    contexts: tuple[str, ...]
    doc_ids: tuple[str, ...] = ()
    score: float | None = None
    """The retrieval score the answer stage reads (the sample system's threshold); None: none."""

    @classmethod
    def of(cls, output: SystemOutput) -> Retrieval:
        """The retrieval recorded in a case's output."""
        return cls(tuple(output.ranked_ids), tuple(output.contexts), tuple(output.doc_ids or ()))


class Provider(ABC):
    """Turns cases into system outputs. Failures are per case, never exceptions."""

    remote = False
    """True when outputs come from an outside service: results are checkpointed as they arrive.
    Local providers are deterministic and instant, so a resumed run simply recomputes them."""

    def __init__(self, config: SystemConfig, settings: RunSettings) -> None:
        self.config = config
        self.settings = settings

    def output_fields(self, dataset: Dataset) -> frozenset[str]:
        """Output fields this provider gives for every case of ``dataset`` (a metric reading
        another one is refused before the run)."""
        return frozenset(OUTPUT_FIELDS)

    def check(self, dataset: Dataset) -> None:  # noqa: B027 - optional hook, nothing to check by default
        """Check, against ``dataset``, everything that needs neither the system nor its code
        (templates, expressions, secrets, files, recorded data): ``run`` and ``validate`` both
        call it."""

    def preflight(self, dataset: Dataset) -> None:  # noqa: B027 - optional hook, nothing to check by default
        """What else is checkable before a run is created, reaching the system (a connection,
        an import); called after :meth:`check`."""

    def reports_usage(self) -> bool:
        """Whether the system's replies are read for the tokens its model used
        (:attr:`SystemOutput.tokens`), so that ``cost.prices.system`` can price them."""
        return False

    def identity(self) -> str | None:
        """What defines the system beyond its config (e.g. its knowledge base's content hash);
        enters the config hash. Called after :meth:`preflight`."""
        return None

    def probe(self, case: Case) -> dict[str, Any]:
        """Ask the system about ``case`` once and say what came back and what was read from it
        (``ragexp validate --probe``): the report's ``missing`` lists the outputs the mapping
        found nothing for. Called after :meth:`preflight`."""
        raise ProviderError(f"--probe: provider kind {self.config.kind} calls no live system; nothing to probe")

    @abstractmethod
    def run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        """Evaluate every case and report each through ``on_result``."""

    def ask_chains(self, chains: Turns, on_result: OnResult) -> None:
        """Evaluate every case of ``chains`` (positions in ``chains.cases``), each chain's cases
        in order, each prepared (:meth:`Turns.prepare`) after the one before it has its result,
        and report each result, and the cases a failure leaves not asked, through ``on_result``.
        Here in rounds over :meth:`run` (a local system, which answers at once); a remote one
        asks a chain's next case as soon as it is ready."""
        ready = chains.first()
        while ready:
            for index in ready:
                chains.prepare(index)
            following: list[int] = []

            def arrived(
                position: int, result: CaseResult, ready: list[int] = ready, following: list[int] = following
            ) -> None:
                index = ready[position]
                on_result(index, result)
                unasked, after = chains.settled(index, result)
                for other, outcome in unasked:
                    on_result(other, outcome)
                if after is not None:
                    following.append(after)

            self.run([chains.cases[index] for index in ready], arrived)
            ready = following

    def generation_missing(self) -> str | None:
        """What this system lacks to answer from given contexts (``diff --attribute``), in a
        few words naming the key to set; None when it can."""
        return (
            f"a {self.config.kind} system has no answer stage of its own to call (the sample system has one; "
            "an http or python system, once provider.system.generate is set)"
        )

    def retrieval(self, case: Case, output: SystemOutput) -> Retrieval:
        """What this system's retrieval gave for ``case``, from the case's recorded ``output``
        (a system that can recompute it, with what its answer stage reads, does)."""
        return Retrieval.of(output)

    def generate(self, cases: Sequence[Case], retrievals: Sequence[Retrieval], on_result: OnResult) -> None:
        """Answer each case from its retrieval, reported through ``on_result`` as ``run`` does;
        an output keeps the retrieval it was given. Called after :meth:`preflight`."""
        raise ProviderError(self.generation_missing() or "this system cannot answer from given contexts")


PROVIDERS: dict[str, str] = {
    "sample": "ragexp.providers.sample:SampleProvider",
    "fake": "ragexp.providers.fake:FakeProvider",
    "replay": "ragexp.providers.replay:ReplayProvider",
    "http": "ragexp.providers.http:HttpProvider",
    "python": "ragexp.providers.python:PythonProvider",
}
"""Kind -> ``module:Class``; modules are imported only when their kind is used."""


def build_provider(config: SystemConfig, settings: RunSettings) -> Provider:
    target = PROVIDERS.get(config.kind)
    if target is None:
        raise ConfigError(
            f"config: provider.system.kind: unknown provider '{config.kind}' (known: {', '.join(sorted(PROVIDERS))})"
        )
    module_name, _, class_name = target.partition(":")
    cls: type[Provider] = getattr(importlib.import_module(module_name), class_name)
    return cls(config, settings)
