"""raysoft installed as Python users install tools: the wheel (``pip wheel .``) into a fresh
virtual environment, then, from an empty folder, the README's job, an example and ``raysoft
new``'s project with its own tests (issue #55: ``config file 'jobs/fedsoft_synthetic.yaml' not
found``, no job or example shipped, no way to start a project).

The fresh environment is offline: raysoft's dependencies are those of the virtual environment the
tests run in, reached by a ``.pth`` line (a ``.pth`` of that site-packages is not run, so its
editable raysoft is not imported); the test checks that the raysoft imported is the wheel's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support.paths import ROOT

pytestmark = pytest.mark.slow

SMALL = ["--set", "ray.backend=inprocess", "--set", "output.progress=none", "--set", "algorithm.rounds=2",
         "--set", "algorithm.eval_every=1"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel built from this checkout installed (its ``bin``)."""
    tmp = tmp_path_factory.mktemp("installed")
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("raysoft-*.whl")
    base = getattr(sys, "_base_executable", sys.executable)
    venv = tmp / "venv"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "raysoft_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    return venv / "bin"


def _env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    return env


def _sh(bin_dir: Path, cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(list(args), cwd=cwd, env=_env(bin_dir), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def test_the_wheel_is_imported_not_the_checkout(installed, tmp_path):
    where = _sh(installed, tmp_path, "python", "-c", "import raysoft; print(raysoft.__file__)").stdout.strip()
    assert where.startswith(str(installed.parent)) and not where.startswith(str(ROOT))
    version = _sh(installed, tmp_path, "raysoft", "--version").stdout
    assert version.startswith("raysoft 0.1.0 ") and "commit" not in version  # not a checkout
    assert "ray 2.60.0" in version and "torch " in version and "python " in version


def test_the_readme_job_runs_from_an_empty_folder(installed, tmp_path):
    done = _sh(installed, tmp_path, "raysoft", "run", "jobs/fedsoft_synthetic.yaml", *SMALL)
    run_dir = tmp_path / done.stdout.strip().splitlines()[-1]
    assert (run_dir / "summary.json").is_file() and run_dir.parent == tmp_path / "runs"
    assert "shipped with raysoft" in done.stderr
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["raysoft"] == "0.1.0" and prov["commit"] is None and prov["device_used"] == "cpu"
    report = _sh(installed, tmp_path, "raysoft", "report", str(run_dir))
    assert "raysoft 0.1.0" in (run_dir / "report.md").read_text(), report.stdout
    # the job files written out, then run as written
    _sh(installed, tmp_path, "raysoft", "example", "jobs")
    assert (tmp_path / "jobs" / "fedsoft_synthetic.yaml").read_text() == (
        ROOT / "jobs" / "fedsoft_synthetic.yaml").read_text()


def test_an_example_runs_from_its_folder(installed, tmp_path):
    listed = _sh(installed, tmp_path, "raysoft", "example").stdout
    assert "fedprox" in listed and "jobs/fedsoft_synthetic.yaml" in listed
    _sh(installed, tmp_path, "raysoft", "example", "fedprox")
    here = tmp_path / "fedprox"
    assert {p.name for p in here.iterdir()} >= {"fedprox.py", "job.yaml", "README.md"}
    done = _sh(installed, here, "raysoft", "run", "job.yaml", *SMALL)
    assert (here / done.stdout.strip().splitlines()[-1] / "summary.json").is_file()


def test_a_new_project_runs_and_passes_its_own_tests(installed, tmp_path):
    _sh(installed, tmp_path, "raysoft", "new", "my_algo")
    here = tmp_path / "my_algo"
    done = _sh(installed, here, "raysoft", "run", "job.yaml", *SMALL)
    assert (here / done.stdout.strip().splitlines()[-1] / "summary.json").is_file()
    tests = _sh(installed, here, "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_algo.py")
    assert "3 passed" in tests.stdout
