"""ragexp's ``hydra/launcher=ray`` as a Hydra plugin (Hydra instantiates launchers from this package only).

Hydra imports every ``hydra_plugins`` module on start-up, so this one imports neither Ray nor
ragexp's launch code until a Ray sweep starts: :func:`ragexp.workflows.multirun_ray.launch` does the work.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class RayLauncher(Launcher):
    """``conf/hydra/launcher/ray.yaml``: ``ray.init`` and ``ray.remote`` as in hydra-ray-launcher."""

    def __init__(self, ray: DictConfig) -> None:
        self.ray_cfg = ray
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from ragexp.workflows.multirun_ray import launch

        if self.config is None or self.hydra_context is None or self.task_function is None:
            raise RuntimeError("RayLauncher.launch called before setup")  # Hydra always calls setup first
        return launch(self.ray_cfg, self.config, self.hydra_context, self.task_function, job_overrides, initial_job_idx)
