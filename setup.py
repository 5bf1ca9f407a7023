"""The wheel's one build step beyond pyproject.toml: the repository's top-level config tree
``conf/`` goes into the package as ``ragexp/conf``, where an installed ragexp reads it
(``ragexp.paths.package_conf``). setuptools maps folders to packages but has no option that puts a
folder outside the package into it, hence this command. An editable install gets nothing copied:
a checkout reads ``conf/`` in place."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONF = Path(__file__).resolve().parent / "conf"


class BuildPyWithConf(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "ragexp" / "conf"
        shutil.rmtree(target, ignore_errors=True)  # a file deleted from conf/ must not ship from an earlier build
        for source in sorted(CONF.rglob("*.yaml")):
            destination = target / source.relative_to(CONF)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            target = Path(self.build_lib) / "ragexp" / "conf"
            outputs += [str(target / source.relative_to(CONF)) for source in sorted(CONF.rglob("*.yaml"))]
        return outputs


setup(cmdclass={"build_py": BuildPyWithConf})
