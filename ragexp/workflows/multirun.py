"""``ragexp run -m``: a Hydra multirun, one MLflow run per point under a parent run (the sweep).

Hydra expands the sweep and its launcher runs the points (one after the other by default,
``hydra/launcher=joblib`` for parallel processes, submitit for Slurm, ``hydra/launcher=ray`` for
Ray tasks through :mod:`ragexp.workflows.multirun_ray`); ragexp writes no scheduler. Each point is an ordinary
run tagged with its sweep and its overrides, so ``diff`` and ``gate`` take any two of them. A
failing point is reported and the others still run.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import socket
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragexp import limits
from ragexp.config.compose import compose, from_composed, prepare_overrides, search_path
from ragexp.config.tracking import chosen_uri
from ragexp.errors import ConfigError, RagexpError
from ragexp.escape import terminal
from ragexp.tracking.store import FAILED, FINISHED, RUNNING, TAG_PREFIX, RunRecord, Store

PARENT_ENV = "RAGEXP_SWEEP_PARENT"
URI_ENV = "RAGEXP_SWEEP_TRACKING_URI"
FAILED_TAG = TAG_PREFIX + "sweep.failed."
FORWARDED_ENV_PREFIXES = ("RAGEXP_", "MLFLOW_")
"""Environment variables a point's worker gets from the sweep's process when the launcher does not
inherit it (Ray): the sweep's parent run and tracking URI, ragexp's and MLflow's settings."""
LAUNCHER_NEEDS = {
    "ray": (("ray", "hydra_plugins.hydra_ray_launcher"), "Ray and hydra-ray-launcher: pip install 'ragexp[ray]'")
}
"""Launchers whose packages are an optional extra: the modules they import, and what installs them."""
HYDRA_QUIET = ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled", "hydra.output_subdir=null"]


class LaunchAborted(BaseException):
    """A launcher's :class:`RagexpError`, carried through Hydra: ``hydra.main`` turns any
    ``Exception`` a launcher raises into a traceback and exit 1, while the CLI owes one line."""

    def __init__(self, error: RagexpError) -> None:
        super().__init__(str(error))
        self.error = error


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


def check_launcher(overrides: Sequence[str]) -> None:
    """A launcher from an extra that is not installed is named before the sweep starts."""
    for item in overrides:
        key, _, name = item.partition("=")
        if key.lstrip("+") == "hydra/launcher" and name in LAUNCHER_NEEDS:
            modules, install = LAUNCHER_NEEDS[name]
            missing = [module for module in modules if importlib.util.find_spec(module) is None]
            if missing:
                raise ConfigError(f"config: hydra/launcher={name} needs {install}")


def run_sweep(overrides: Sequence[str], *, tracking_uri: str | None = None) -> SweepOutcome:
    """``ragexp run -m``: one run per point under a parent run; ``tracking_uri``: ``--tracking-uri``."""
    fixed, swept = split_overrides(overrides)
    hydra_keys = [o for o in swept if o.startswith("hydra")]
    check_launcher([*fixed, *hydra_keys])
    if any(o.split("=", 1)[0].lstrip("+~") in ("tracking.uri", "experiment") for o in swept):
        raise ConfigError("config: tracking.uri and experiment cannot be swept: a sweep lives in one experiment")
    base = compose([o for o in fixed if not o.startswith("hydra")])  # validates everything not swept
    store = Store(chosen_uri(tracking_uri, fixed, base.tracking.uri), timeout_s=base.tracking.timeout_s)
    points = " ".join(o for o in overrides if not o.startswith("hydra"))
    limits.check(limits.EXPERIMENT_NAME, base.experiment, "experiment")
    parent = store.create_run(
        base.experiment,
        limits.fit(limits.RUN_NAME, f"sweep {points}"),  # the tag below keeps it all
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

        try:
            with warnings.catch_warnings():
                # ray.yaml is checked against hydra-ray-launcher's schema of the same name, as meant;
                # Hydra warns about that matching on every sweep (its circular `defaults` fix recurses).
                warnings.filterwarnings("ignore", message=r"\n'hydra/launcher/\w+' is validated against ConfigStore")
                hydra.main(config_path=str(directory), config_name=name, version_base="1.3")(run_point)()
        except LaunchAborted as aborted:
            raise aborted.error from None
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

    from ragexp.workflows.run import execute
    from ragexp.workflows.run_plan import plan_run

    gc.disable()  # as in the CLI's own process (a launcher's worker does not go through main())
    job = HydraConfig.get()
    point = point_label(job.overrides.task)
    number = str(job.job.num)
    parent, uri = os.environ[PARENT_ENV], os.environ[URI_ENV]
    try:
        raw: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
        config = from_composed(raw, dict(job.runtime.choices), list(job.overrides.task))
        # The sweep's store, chosen once by the sweep's process for every point.
        store = Store(uri, timeout_s=config.tracking.timeout_s)
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
                # which machine and process ran the point (a launcher's worker, a Slurm job)
                TAG_PREFIX + "sweep.worker": f"{socket.gethostname()}:{os.getpid()}",
            },
        )
        sys.stderr.write(
            terminal(f"point {number} [{point}]: run {outcome.run_id}, {outcome.error_count} errored cases") + "\n"
        )
    except RagexpError as exc:
        record_failure(number, point, str(exc))


def point_label(overrides: Sequence[str]) -> str:
    """A point as the user typed it: typed keys were forced (`++k=3`) only so Hydra accepts them."""
    return " ".join(item.removeprefix("++") for item in overrides)


def record_failure(number: str, point: str, reason: str) -> None:
    """A failed point on the sweep's parent run (``ragexp.sweep.failed.N``), read back by run_sweep."""
    sys.stderr.write(terminal(f"ragexp: sweep point {number} [{point}] failed: {reason}") + "\n")
    Store(os.environ[URI_ENV]).set_tags(
        os.environ[PARENT_ENV], {FAILED_TAG + number: limits.fit(limits.TAG_VALUE, f"[{point}] {reason}")}
    )


def record_lost_point(number: str, point: str, reason: str, experiment: str) -> None:
    """A point whose process died (a launcher saw its worker go): a failed point, and the run it
    had started, left RUNNING by the dead process, ended FAILED with the reason (``--resume`` takes it)."""
    record_failure(number, point, reason)
    store = Store(os.environ[URI_ENV])
    clause = f"tags.`{TAG_PREFIX}sweep` = '{os.environ[PARENT_ENV]}' and tags.`{TAG_PREFIX}sweep.num` = '{number}'"
    for run in store.search(experiment, limit=10, filter_string=clause):
        if run.status == RUNNING:
            store.set_tags(
                run.run_id,
                {TAG_PREFIX + "status": "failed", TAG_PREFIX + "stopped_because": limits.fit(limits.TAG_VALUE, reason)},
            )
            store.end_run(run.run_id, FAILED)
