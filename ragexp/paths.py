"""Where ragexp finds its packaged config and data, and the user's own config folder.

Standard library only: the sample service script imports it too.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

CONFIG_DIR_ENV = "RAGEXP_CONFIG_DIR"
LEGACY_CONFIG_DIR_ENV = "RAGEXP_CONF_DIR"


def _package_dir(name: str) -> Path:
    # A wheel installs ragexp as plain files, so the traversable is a real folder Hydra can read.
    return Path(str(files("ragexp") / name)).resolve()


def package_conf() -> Path:
    """The packaged config tree: every default group and preset.

    The repository keeps it at its top level (``conf/``); the wheel's build configuration ships it
    inside the package (``ragexp/conf``). An installed package reads its own copy, a checkout (an
    editable install) the repository's."""
    inside = _package_dir("conf")
    if (inside / "config.yaml").is_file():
        return inside
    checkout = checkout_conf()
    return checkout if checkout is not None else inside


def checkout_conf() -> Path | None:
    """The top-level ``conf/`` of the repository this package is imported from, if it is."""
    root = _package_dir(".").parent
    # pyproject.toml next to conf/ tells a checkout from a site-packages that holds some other "conf".
    if (root / "pyproject.toml").is_file() and (root / "conf" / "config.yaml").is_file():
        return root / "conf"
    return None


def experiment_trees() -> list[Path]:
    """The bundled experiments' config folders in a checkout (``experiments/NAME/``, each holding
    the ``setup/`` files of that experiment); none in an installed package, whose build put their
    setups into ``ragexp/conf/setup/``."""
    conf = package_conf()
    if conf != checkout_conf():
        return []
    return sorted(path.parent for path in (conf.parent / "experiments").glob("*/setup") if path.is_dir())


def packaged_trees() -> list[Path]:
    """Every packaged config folder, in Hydra's search order: the packaged tree, then the bundled
    experiments' folders. Installed or in a checkout, they hold the same files."""
    return [package_conf(), *experiment_trees()]


def package_data() -> Path:
    """The bundled evaluation sets and knowledge bases (``ragexp/data``)."""
    return _package_dir("data")


def user_conf_dir(explicit: str | None = None) -> Path | None:
    """The user's config folder, composed over the packaged defaults: ``--config-dir``, else
    ``RAGEXP_CONFIG_DIR`` (or the older ``RAGEXP_CONF_DIR``), else ``./conf`` when it exists."""
    given = explicit or os.environ.get(CONFIG_DIR_ENV) or os.environ.get(LEGACY_CONFIG_DIR_ENV)
    if given:
        return Path(given).expanduser().resolve()
    local = Path("conf")
    return local.resolve() if local.is_dir() else None


def data_roots() -> list[Path]:
    """Folders a relative data path is tried against, after the working directory: the folder
    holding the user's ``conf/`` (so a user's config names files from their repo's root), then
    the packaged data."""
    roots = []
    user = user_conf_dir()
    if user is not None and user != package_conf():  # a checkout's own conf/ is no user's folder
        roots.append(user.parent)
    roots.append(package_data())
    return roots
