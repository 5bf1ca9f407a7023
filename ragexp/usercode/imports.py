"""Importing a team's own code: the object ``package.module:attr`` names (in a daemon thread, under a
deadline), and what identifies the source behind it. ``where`` is the config key an error names."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from ragexp import secrets
from ragexp.errors import ProviderError

MISSING = "???"
"""What the presets hold until the user names a target (Hydra's mandatory-value marker)."""


def check_target(spec: str, where: str) -> tuple[str, str]:
    """``package.module:attr`` split into the module and the attribute path; a ProviderError
    naming ``where.target`` when it is not that."""
    if spec == MISSING:
        raise ProviderError(f"{where}.target: required: the function or object to call, as package.module:attr")
    module_name, colon, attr = spec.partition(":")
    names = [*module_name.split("."), *attr.split(".")]
    if not colon or not all(name.isidentifier() for name in names):
        raise ProviderError(f"{where}.target: '{spec}' is not package.module:attr (e.g. app:chain, app:engine.query)")
    return module_name, attr


def import_target(spec: str, path: str | None, where: str, *, timeout_s: float | None = None) -> tuple[Any, ModuleType]:
    """The object ``package.module:attr`` names (``attr`` may be dotted) and the module it is in;
    a ProviderError naming ``where.target`` (or ``where.path``) otherwise. The working directory
    and ``path`` go first on the import path; an import still running after ``timeout_s`` is
    refused (None: no bound)."""
    module_name, attr = check_target(spec, where)
    _on_import_path(path, where)
    module = _import(module_name, where, timeout_s)
    obj: Any = module
    for depth, name in enumerate(attr.split(".")):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            owner = ".".join([module_name, *attr.split(".")[:depth]])
            raise ProviderError(f"{where}.target: '{owner}' has no attribute '{name}'") from None
        except Exception as exc:  # a property that raises is the target's bug, reported as such
            raise ProviderError(secrets.scrub(f"{where}.target: reading '{spec}' raised {describe(exc)}")) from None
    return obj, module


def _on_import_path(path: str | None, where: str) -> None:
    folders = [os.getcwd()]
    if path is not None:
        given = Path(path).expanduser().resolve()
        if not given.is_dir():
            raise ProviderError(f"{where}.path: no such folder: {path}")
        folders.insert(0, str(given))
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def _import(name: str, where: str, timeout_s: float | None = None) -> ModuleType:
    """The module, imported in a daemon thread: an import that hangs (a model download, a
    service that does not answer) is given up after ``timeout_s``, and whatever the module raises,
    ``KeyboardInterrupt`` and ``SystemExit`` included, is its own failure; a Ctrl-C of the user's
    reaches this thread, which only waits."""
    if name in sys.modules:
        return _imported(name, where)
    box: list[ModuleType | BaseException] = []

    def work() -> None:
        try:
            box.append(_imported(name, where))
        except BaseException as exc:  # the module's own failure, reported as the target's
            box.append(exc)

    thread = threading.Thread(target=work, name="ragexp-python-import", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not box:
        raise ProviderError(
            f"{where}.target: importing '{name}' did not finish within {timeout_s:g} s ({where}.timeout_s): "
            "raise the timeout, or build what is slow on the first call instead of at import"
        )
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _imported(name: str, where: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise ProviderError(
                f"{where}.target: no module named '{exc.name}' in the working directory, "
                f"{where}.path or the installed packages"
            ) from None
        raise ProviderError(secrets.scrub(f"{where}.target: importing '{name}' failed: {describe(exc)}")) from None
    except BaseException as exc:  # SystemExit, KeyboardInterrupt raised by the module itself
        raise ProviderError(secrets.scrub(f"{where}.target: importing '{name}' failed: {describe(exc)}")) from None


def describe(exc: BaseException) -> str:
    """``Type: message``, or the type alone when the message is empty or cannot be printed
    (its ``__str__`` raises)."""
    name = _type_name(exc)
    try:
        text = str(exc)
    except BaseException:  # the target's exception must not fail ragexp's report of it
        return f"{name} (its message could not be printed)"
    return f"{name}: {text}" if text else name


def _type_name(exc: BaseException) -> str:
    try:
        return str(type(exc).__name__)
    except BaseException:  # pragma: no cover - a metaclass whose __name__ raises
        return "an exception"


def source_identity(module: ModuleType, file: Path | None = None) -> str:
    """What identifies the code behind a target: ``dist==version`` for a module installed from a
    distribution, else the sha256 of the module's source file (the team's code, edited in place
    or installed editable, whose version does not move with each change). ``file``: the module's
    file, for a module not imported."""
    file = file or getattr(module, "__file__", None)
    if not file:
        return f"module:{module.__name__}"
    where = Path(file)
    if {"site-packages", "dist-packages"} & set(where.parts):
        top = module.__name__.partition(".")[0]
        for name in importlib.metadata.packages_distributions().get(top, []):
            return f"{name}=={importlib.metadata.version(name)}"
    try:
        digest = hashlib.sha256(where.read_bytes()).hexdigest()
    except OSError:
        return f"module:{module.__name__}"
    return f"sha256:{digest}"


def module_identity(name: str) -> str:
    """:func:`source_identity` of a module found by its name, without running it (its parent
    packages are imported); ``module:NAME`` when it cannot be found."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return f"module:{name}"
    return source_identity(ModuleType(name), Path(spec.origin))
