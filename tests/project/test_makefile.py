"""The Makefile's set-up, run on a stand-in Python (no real venv is made)."""

from __future__ import annotations

import shutil
import subprocess

from support.paths import ROOT

FAKE_PYTHON = """#!/usr/bin/env bash
# a stand-in python: its version is the file VERSION beside it; -m venv DIR copies it into DIR/bin
here=$(cd "$(dirname "$0")" && pwd)
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; cp "$here/VERSION" "$3/bin/"; exit 0
fi
if [ "$1" = "-m" ]; then exit 0; fi
case "$2" in *print*) cat "$here/VERSION";; esac
"""


def _python(folder, version):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "python").write_text(FAKE_PYTHON)
    (folder / "python").chmod(0o755)
    (folder / "VERSION").write_text(version + "\n")
    return folder / "python"


def test_a_python_asked_for_remakes_a_venv_of_another_python(tmp_path):
    """``PYTHON=python3.12 make run`` with a .venv of 3.11: said, and the venv made again with
    3.12; the same Python, or no PYTHON given, keeps the venv."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    _python(tmp_path / ".venv" / "bin", "3.11")
    (tmp_path / ".venv" / ".installed").touch()
    wanted = _python(tmp_path / "py312", "3.12")

    def make(*args):
        return subprocess.run(["make", "--no-print-directory", "install", *args], cwd=tmp_path, capture_output=True,
                              text=True, check=True).stdout

    assert make() == ""  # no PYTHON given: the venv is kept
    out = make(f"PYTHON={wanted}")
    assert f"is Python 3.12 but .venv has Python 3.11: making .venv again with {wanted}" in out
    assert (tmp_path / ".venv" / "bin" / "VERSION").read_text().strip() == "3.12"
    assert make(f"PYTHON={wanted}") == ""  # now the same Python: nothing to do
