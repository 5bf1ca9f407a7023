"""``hydra/launcher=ray``: each sweep point one Ray task, on a running cluster or a local Ray.

The Hydra plugin (``hydra_plugins.ragexp_ray_launcher``, where Hydra looks for launchers) calls
:func:`launch`.

The tasks are hydra-ray-launcher's own (its ``launch_job_on_ray``: Hydra's ``run_job`` of
:func:`ragexp.workflows.multirun.run_point` in a Ray worker); this launcher differs from the plugin's in what
happens around them:

- ``ray.init`` gets the keys that only start a Ray (``object_store_memory``, ``num_cpus``, ...)
  only when they are set, so ``address=auto`` attaches to a cluster (the plugin always sets
  ``object_store_memory``, which Ray refuses when attaching: hydra issue #2893);
- the workers get the sweep's parent run, tracking URI and config folder through the task's
  ``runtime_env`` (workers of a cluster do not inherit the driver's environment);
- a point whose task is lost (its worker died, its node went away) is recorded as a failed point
  while the others finish, instead of aborting the sweep at the first ``ray.get``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn, JobStatus, filter_overrides, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from ragexp.errors import ConfigError
from ragexp.paths import CONFIG_DIR_ENV, user_conf_dir
from ragexp.workflows.multirun import FORWARDED_ENV_PREFIXES, LaunchAborted, point_label, record_lost_point

START_ONLY = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory")
"""``ray.init`` keys that configure a Ray started by this process; Ray refuses most of them when
attaching to a running cluster."""


def forwarded_env() -> dict[str, str]:
    """What a worker needs of the driver's environment: ragexp's and MLflow's variables (the
    sweep's parent run and tracking URI among them) and the config folder."""
    env = {key: value for key, value in os.environ.items() if key.startswith(FORWARDED_ENV_PREFIXES)}
    conf = user_conf_dir()
    if conf is not None:
        env[CONFIG_DIR_ENV] = str(conf)  # `./conf` of the driver is not the worker's working directory
    return env


def init_options(init: dict[str, Any]) -> dict[str, Any]:
    """``ray.init`` keyword arguments: null keys dropped (attaching works with the start-only keys
    left null), a start-only key set together with an address refused in one line."""
    options = {key: value for key, value in init.items() if value is not None}
    address = options.get("address")
    clashing = [key for key in START_ONLY if key in options]
    if address and clashing:
        raise ConfigError(
            f"config: hydra.launcher.ray.init.{clashing[0]} only applies to a Ray started by the sweep; "
            f"with address={address} the cluster's own settings apply: leave it null"
        )
    return options


def launch(
    ray_cfg: DictConfig,
    config: DictConfig,
    hydra_context: HydraContext,
    task_function: TaskFunction,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> Sequence[JobReturn]:
    """The launcher's work (``hydra_plugins.ragexp_ray_launcher.RayLauncher.launch``): one Ray task
    per point, every lost task a failed point."""
    # Ray relays what workers and raylets print to the driver's stdout; the sweep's stdout is its
    # result (`--json`). Disconnecting at the end stops that relay (and a Ray started here).
    with contextlib.redirect_stdout(sys.stderr):
        try:
            return _launch(ray_cfg, config, hydra_context, task_function, job_overrides, initial_job_idx)
        except ConfigError as exc:
            raise LaunchAborted(exc) from None
        finally:
            if "ray" in sys.modules:
                sys.modules["ray"].shutdown()


def _launch(
    ray_cfg: DictConfig,
    config: DictConfig,
    hydra_context: HydraContext,
    task_function: TaskFunction,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> Sequence[JobReturn]:
    import ray
    from hydra.core.singleton import Singleton
    from hydra_plugins.hydra_ray_launcher._launcher_util import launch_job_on_ray

    setup_globals()
    init = init_options(OmegaConf.to_container(ray_cfg.init, resolve=True))  # type: ignore[arg-type]
    remote: dict[str, Any] = OmegaConf.to_container(ray_cfg.remote, resolve=True)  # type: ignore[assignment]
    remote = {key: value for key, value in remote.items() if value is not None}
    runtime_env = dict(remote.get("runtime_env") or {})
    runtime_env["env_vars"] = {**forwarded_env(), **(runtime_env.get("env_vars") or {})}
    remote["runtime_env"] = runtime_env
    if not ray.is_initialized():
        try:
            ray.init(**init)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            where = init.get("address") or "a local Ray"
            raise ConfigError(f"config: hydra.launcher.ray: cannot start or reach {where}: {exc}") from None
    submitted = []
    for number, overrides in enumerate(job_overrides, start=initial_job_idx):
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"ray_{number}"
            sweep_config.hydra.job.num = number
        ref = launch_job_on_ray(
            hydra_context, OmegaConf.create(remote), sweep_config, task_function, Singleton.get_state()
        )
        submitted.append((number, list(overrides), sweep_config, ref))
    # Every task is already submitted: waiting on them in order loses no parallelism, and a
    # lost one is recorded where run_point records its own failures while the others go on.
    results = []
    for number, overrides, sweep_config, ref in submitted:
        try:
            results.append(ray.get(ref))
        except ray.exceptions.RayError as exc:
            record_lost_point(str(number), point_label(overrides), lost_reason(exc), str(sweep_config.experiment))
            results.append(
                JobReturn(
                    overrides=filter_overrides(overrides),
                    cfg=sweep_config,
                    hydra_cfg=config,
                    working_dir="",
                    task_name=str(config.hydra.job.name),
                    # Recorded above as a failed point, like run_point's own failures, so Hydra's
                    # sweeper does not abort the sweep over it.
                    status=JobStatus.COMPLETED,
                    _return_value=None,
                )
            )
    return results


def lost_reason(exc: BaseException) -> str:
    """Ray's explanation in one line: its error type and the first sentences it gives."""
    text = " ".join(str(exc).split())
    return f"Ray task lost ({type(exc).__name__}): {text[:400]}"
