"""The build's one addition to pyproject.toml: the wheel carries the jobs and examples a user is
told to run (``raysoft/_shipped/jobs``, ``raysoft/_shipped/examples``), copied from the checkout's
``jobs/`` and ``examples/`` when the package is built, so that an installed raysoft finds them
(:mod:`raysoft.shipped`; ``raysoft example`` writes them out). The checkout keeps one copy."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("jobs", "examples")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        for name in SHIPPED:
            source = root / name
            if not source.is_dir():  # a build from a partial tree (the Docker image copies raysoft/ only)
                continue
            target = Path(self.build_lib) / "raysoft" / "_shipped" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "runs", ".*"))


setup(cmdclass={"build_py": BuildPy})
