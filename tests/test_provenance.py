"""Which raysoft made a run (issue #55): ``raysoft --version`` failed ("the following arguments are
required: command"), and no run recorded raysoft's, Ray's or torch's version, a commit or the
machine. Now ``provenance.json``, shown by ``raysoft report``; a resume on other versions says so."""

from __future__ import annotations

import json
import platform

import pytest
import yaml
from support.configs import small_config

import raysoft
from raysoft import provenance
from raysoft.cli import main
from raysoft.report.markdown import provenance_lines


def test_version_prints_raysoft_ray_torch_python_and_the_checkout_commit(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    commit = provenance.git_commit()
    assert commit  # the tests run from a checkout
    assert out.startswith(f"raysoft {raysoft.__version__} (commit {commit[:12]}")
    assert "ray 2.60.0" in out and f"python {platform.python_version()}" in out


def test_every_run_records_what_made_it_and_report_shows_it(tmp_path):
    r = raysoft.run(small_config(), out=tmp_path)
    p = json.loads((r.run_dir / "provenance.json").read_text())
    assert p["raysoft"] == raysoft.__version__ and p["commit"] == provenance.git_commit()
    assert p["ray"] == "2.60.0" and p["python"] == platform.python_version() and p["torch"]
    assert p["cpus"] >= 1 and p["cpu"] and isinstance(p["gpus"], list)
    assert p["device"] == "auto" and p["device_used"] in ("cpu", "cuda") and p["backend"] == "inprocess"
    lines = provenance_lines(r.run_dir)
    assert lines[0].startswith(f"Made with raysoft {raysoft.__version__} (commit ")
    assert f"torch {p['torch']}" in lines[0] and f"clients on {p['device_used']}" in lines[0]


def test_a_run_from_before_provenance_reports_nothing_of_it(tmp_path):
    assert provenance_lines(tmp_path) == []


def test_a_resume_on_other_versions_says_so_in_one_line(tmp_path, capsys):
    cfg = small_config(algorithm={"clients_per_round": 10}, output={"checkpoint_every": 2, "progress": "none"},
                       faults=[{"kind": "nan_update", "at_round": 3, "client": 0}])
    with pytest.raises(raysoft.errors.UpdateError):
        raysoft.run(cfg, out=tmp_path, dir_name="stopped")
    run_dir = tmp_path / "stopped"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**saved, "faults": []}))
    before = json.loads((run_dir / "provenance.json").read_text())
    (run_dir / "provenance.json").write_text(json.dumps({**before, "torch": "2.3.0"}))
    capsys.readouterr()
    raysoft.resume(run_dir)
    err = capsys.readouterr().err.splitlines()
    assert f"fedsoft: resuming on other versions than the run started with: torch 2.3.0 -> {before['torch']}" in err
    after = json.loads((run_dir / "provenance.json").read_text())
    assert after["torch"] == "2.3.0" and after["resumes"][0]["torch"] == before["torch"]
    assert provenance_lines(run_dir)[1].startswith("Resumed with raysoft")
