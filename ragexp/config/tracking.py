"""Which tracking store a command uses: one precedence for every command that touches one.

1. ``--tracking-uri URI`` or ``tracking.uri=URI`` on the command line: one setting, two
   spellings, taken by every such command (both, naming different stores, is refused);
2. ``tracking.uri`` in a config file (your ``conf/config.yaml``, a setup it selects);
3. ``MLFLOW_TRACKING_URI``;
4. ``sqlite:///mlruns/mlflow.db``.

Steps 3 and 4 are :func:`ragexp.tracking.store.resolve_uri`'s; this module gives what comes
before them (None: nothing set, the environment decides).
"""

from __future__ import annotations

from collections.abc import Sequence

from ragexp.errors import ConfigError
from ragexp.secrets import mask_url

KEY = "tracking.uri"
FLAG = "--tracking-uri"


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def chosen_uri(flag: str | None, overrides: Sequence[str], configured: str | None) -> str | None:
    """For a command that composes the config: ``flag`` (``--tracking-uri``), else ``configured``
    (the composed ``tracking.uri``, which holds a ``tracking.uri=`` override when one was given)."""
    given = any(_key(item) == KEY for item in overrides if "=" in item)
    if flag is not None and given and configured != flag:
        raise ConfigError(
            f"{FLAG} {mask_url(flag)} and {KEY}={mask_url(str(configured))} name two different stores: give one"
        )
    return flag if flag is not None else configured


def store_overrides(command: str, overrides: Sequence[str]) -> str | None:
    """The ``tracking.uri=`` a command that composes no config takes among its arguments (the
    last one given); any other override is refused in one line, naming it."""
    found = None
    for item in overrides:
        if "=" not in item or _key(item) != KEY:
            raise ConfigError(
                f"ragexp {command}: unexpected argument {item!r} (of the config, {command} takes {KEY}=URI only)"
            )
        value = item.split("=", 1)[1]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found = value or None
    return found


def store_uri(command: str, flag: str | None, overrides: Sequence[str] = ()) -> str | None:
    """For a command that composes no config (``runs``, ``diff``, ``report``, ...): the command
    line's store, else the ``tracking.uri`` of your config files (composed only when your config
    folder has a ``config.yaml``, the one file that can set it)."""
    given = store_overrides(command, overrides)
    if flag is not None and given is not None and given != flag:
        raise ConfigError(f"{FLAG} {mask_url(flag)} and {KEY}={mask_url(given)} name two different stores: give one")
    if flag is not None or given is not None:
        return flag if flag is not None else given
    from ragexp.paths import package_conf, user_conf_dir

    user = user_conf_dir()
    if user is None or user == package_conf() or not (user / "config.yaml").is_file():
        return None
    from ragexp.config.compose import compose

    return compose([]).tracking.uri
