"""The wheel's one build step beyond pyproject.toml: the repository's top-level config tree
``conf/`` goes into the package as ``ragexp/conf``, with the setups of the bundled experiments
(``experiments/NAME/setup/*.yaml``) in its ``setup/`` group, which is where an installed ragexp
reads them (``ragexp.paths.packaged_trees``). setuptools maps folders to packages but has no
option that puts a folder outside the package into it, hence this command. An editable install
gets nothing copied: a checkout reads ``conf/`` and ``experiments/`` in place."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def packaged_files() -> dict[str, Path]:
    """Path inside ``ragexp/conf`` -> source file."""
    files = {str(path.relative_to(ROOT / "conf")): path for path in sorted((ROOT / "conf").rglob("*.yaml"))}
    for path in sorted(ROOT.glob("experiments/*/setup/*.yaml")):
        inside = f"setup/{path.name}"
        if inside in files:
            raise SystemExit(f"{path}: setup={path.stem} is also {files[inside]}; setup names are one namespace")
        files[inside] = path
    return files


class BuildPyWithConf(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "ragexp" / "conf"
        shutil.rmtree(target, ignore_errors=True)  # a file deleted from conf/ must not ship from an earlier build
        for inside, source in packaged_files().items():
            destination = target / inside
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            target = Path(self.build_lib) / "ragexp" / "conf"
            outputs += [str(target / inside) for inside in packaged_files()]
        return outputs


setup(cmdclass={"build_py": BuildPyWithConf})
