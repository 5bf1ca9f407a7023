"""``ragexp run -m``: a Hydra multirun, one MLflow run per point under a parent run (the sweep).

Hydra expands the sweep and its launcher runs the points (one after the other by default,
``hydra/launcher=joblib`` for parallel processes, submitit for Slurm); ragexp writes no
scheduler. Each point is an ordinary run tagged with its sweep and its overrides, so ``diff``
and ``gate`` take any two of them. A failing point is reported and the others still run.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragexp.config.compose import (
    compose,
    name_dataset_from_path,
    name_provider,
    prepare_overrides,
    search_path,
    validate,
)
from ragexp.errors import ConfigError, RagexpError
from ragexp.tracking import limits
from ragexp.tracking.store import FAILED, FINISHED, TAG_PREFIX, RunRecord, Store

PARENT_ENV = "RAGEXP_SWEEP_PARENT"
URI_ENV = "RAGEXP_SWEEP_TRACKING_URI"
FAILED_TAG = TAG_PREFIX + "sweep.failed."
HYDRA_QUIET = ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled", "hydra.output_subdir=null"]


@dataclass
class SweepOutcome:
    parent: str
    runs: list[RunRecord]
    failures: dict[str, str]
    """Point number -> what went wrong."""


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(fixed overrides, swept overrides) as Hydra's own parser reads them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as exc:
        raise ConfigError(f"config: {str(exc).strip().splitlines()[0]}") from None
    fixed = [o.input_line for o in parsed if not o.is_sweep_override() and o.input_line]
    swept = [o.input_line for o in parsed if o.is_sweep_override() and o.input_line]
    return fixed, swept


def run_sweep(overrides: Sequence[str]) -> SweepOutcome:
    fixed, swept = split_overrides(overrides)
    hydra_keys = [o for o in swept if o.startswith("hydra")]
    if any(o.split("=", 1)[0].lstrip("+~") in ("tracking.uri", "experiment") for o in swept):
        raise ConfigError("config: tracking.uri and experiment cannot be swept: a sweep lives in one experiment")
    base = compose([o for o in fixed if not o.startswith("hydra")])  # validates everything not swept
    store = Store(base.tracking.uri, timeout_s=base.tracking.timeout_s)
    points = " ".join(o for o in overrides if not o.startswith("hydra"))
    limits.check(limits.EXPERIMENT_NAME, base.experiment, "experiment")
    parent = store.create_run(
        base.experiment,
        limits.fit(limits.RUN_NAME, f"sweep {points}"),
        {
            TAG_PREFIX + "sweep.role": "parent",
            TAG_PREFIX + "sweep.overrides": limits.fit(limits.TAG_VALUE, points),
        },
        {},
    )
    os.environ[PARENT_ENV], os.environ[URI_ENV] = parent, store.uri
    folder = store.state_dir() / "sweeps" / parent
    directory, name, search = search_path()
    argv = sys.argv
    sys.argv = [
        "ragexp",
        "--multirun",
        *prepare_overrides([o for o in overrides if o not in hydra_keys]),
        *hydra_keys,
        *search,
        *HYDRA_QUIET,
        f"hydra.sweep.dir={folder}",
        "hydra.sweep.subdir=${hydra.job.num}",
    ]
    status = FAILED
    try:
        import hydra

        hydra.main(config_path=str(directory), config_name=name, version_base="1.3")(run_point)()
        runs = store.search(base.experiment, limit=10_000, filter_string=f"tags.`{TAG_PREFIX}sweep` = '{parent}'")
        record = store.get_run(parent)
        failures = {key[len(FAILED_TAG) :]: value for key, value in record.tags.items() if key.startswith(FAILED_TAG)}
        status = FINISHED if not failures else FAILED
        return SweepOutcome(parent, sorted(runs, key=lambda r: int(r.tag("sweep.num", "0"))), failures)
    finally:
        sys.argv = argv
        store.end_run(parent, status)


def run_point(cfg: Any) -> None:
    """One sweep point (Hydra's task function; also runs in launcher worker processes)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from ragexp.runner import execute, plan_run

    gc.disable()  # as in the CLI's own process (a launcher's worker does not go through main())
    job = HydraConfig.get()
    # Typed keys were forced (`++k=3`) only so Hydra accepts them; the point reads as typed.
    point = " ".join(item.removeprefix("++") for item in job.overrides.task)
    number = str(job.job.num)
    parent, uri = os.environ[PARENT_ENV], os.environ[URI_ENV]
    try:
        raw: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
        task = [item.removeprefix("++") for item in job.overrides.task]
        name_provider(raw, dict(job.runtime.choices), task)
        config = validate(name_dataset_from_path(raw, task))
        store = Store(config.tracking.uri or uri, timeout_s=config.tracking.timeout_s)
        plan = plan_run(config, store.state_dir())
        outcome = execute(
            plan,
            store,
            parent=parent,
            tags={
                TAG_PREFIX + "sweep": parent,
                TAG_PREFIX + "sweep.role": "point",
                TAG_PREFIX + "sweep.point": limits.fit(limits.TAG_VALUE, point),
                TAG_PREFIX + "sweep.num": number,
            },
        )
        sys.stderr.write(f"point {number} [{point}]: run {outcome.run_id}, {outcome.error_count} errored cases\n")
    except RagexpError as exc:
        sys.stderr.write(f"ragexp: sweep point {number} [{point}] failed: {exc}\n")
        Store(uri).set_tags(parent, {FAILED_TAG + number: limits.fit(limits.TAG_VALUE, f"[{point}] {exc}"[:5000])})
