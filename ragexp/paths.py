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


def is_ragexp_checkout(root: Path) -> bool:
    """``root`` is a checkout of ragexp itself (any copy, not only the one imported): a
    ``pyproject.toml`` naming the project ``ragexp`` beside a ``conf/config.yaml``."""
    import tomllib

    if not (root / "conf" / "config.yaml").is_file() or not (root / "pyproject.toml").is_file():
        return False
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8")).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return isinstance(project, dict) and project.get("name") == "ragexp"


def packaged_owner(folder: Path) -> str | None:
    """Which of ragexp's own folders ``folder`` is or lies in, said in words (None: a folder of
    the user's): a packaged config tree, the installed package, or the top of a checkout of
    ragexp. A user's config never goes there."""
    target = folder.resolve()
    for tree in packaged_trees():
        if target == tree or tree in target.parents:
            return f"{tree} is ragexp's packaged config tree"
    package = _package_dir(".")
    if target == package or package in target.parents:
        return f"{package} is the ragexp package itself"
    if is_ragexp_checkout(target):
        return f"{target} is a checkout of ragexp itself (its conf/ is ragexp's packaged config tree)"
    return None


def user_conf_dir(explicit: str | None = None) -> Path | None:
    """The user's config folder, composed over the packaged defaults: ``--config-dir``, else
    ``RAGEXP_CONFIG_DIR`` (or the older ``RAGEXP_CONF_DIR``), else ``./conf`` when it exists and
    is not ragexp's own (the ``conf/`` of a checkout of ragexp is the packaged tree, never a user's:
    :func:`packaged_owner`)."""
    given = explicit or os.environ.get(CONFIG_DIR_ENV) or os.environ.get(LEGACY_CONFIG_DIR_ENV)
    if given:
        return Path(given).expanduser().resolve()
    local = Path("conf")
    if not local.is_dir() or is_ragexp_checkout(local.resolve().parent):
        return None
    return local.resolve()


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
