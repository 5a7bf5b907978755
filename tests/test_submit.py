"""jobs/submit.py's entrypoint: the output folder a Ray Job keeps, as `raysoft run --address http://` has it."""

import subprocess
import sys

import pytest
from support.paths import ROOT

from raysoft.config import ConfigError
from raysoft.submit import job_entrypoint

LOCAL = "http://127.0.0.1:8265"


def test_a_raysoft_run_without_out_writes_to_the_configs_folder_made_absolute(tmp_path, monkeypatch):
    # docs/running.md's `jobs/submit.py --address http://127.0.0.1:8265 -- raysoft run jobs/fedsoft_synthetic.yaml`
    # failed in the Job: it refuses the relative output.dir (runs), a folder Ray deletes with the job
    monkeypatch.chdir(ROOT)
    entry = ["raysoft", "run", "jobs/fedsoft_synthetic.yaml"]
    assert job_entrypoint(entry, LOCAL) == [*entry, "--out", str(ROOT / "runs")]
    with_set = ["python", "-m", "raysoft", "run", "jobs/fedsoft_synthetic.yaml", "--set", "output.dir=elsewhere"]
    assert job_entrypoint(with_set, "http://localhost:8265")[-2:] == ["--out", str(ROOT / "elsewhere")]


@pytest.mark.parametrize("entry", [
    ["raysoft", "run", "jobs/fedsoft_synthetic.yaml", "--out", "/shared/runs"],
    ["raysoft", "run", "jobs/fedsoft_synthetic.yaml", "--out=s3://bucket/runs"],
    ["raysoft", "run", "--resume", "/shared/runs/x"],
    ["python", "train.py"],
    ["raysoft", "sweep", "jobs/sweep_example.yaml"],
])
def test_other_entrypoints_are_submitted_as_they_are(entry, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert job_entrypoint(entry, LOCAL) == entry


def test_a_relative_folder_on_a_remote_cluster_is_refused_before_submitting(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match=r"^output\.dir: 'runs' is relative, and a Ray Job's working directory"):
        job_entrypoint(["raysoft", "run", "jobs/fedsoft_synthetic.yaml"], "http://10.0.0.9:8265")
    ran = subprocess.run([sys.executable, str(ROOT / "jobs" / "submit.py"), "--address", "http://10.0.0.9:8265",
                          "--", "raysoft", "run", "jobs/fedsoft_synthetic.yaml"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 2 and ran.stderr.startswith("submit: error: output.dir: 'runs' is relative"), ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


def test_the_options_read_as_taking_a_value_are_raysoft_runs():
    from raysoft.cli import build_parser
    from raysoft.submit import VALUED

    run = build_parser()._subparsers._group_actions[0].choices["run"]
    valued = {o for a in run._actions if a.nargs != 0 and a.option_strings for o in a.option_strings}
    assert set(VALUED) == valued


@pytest.mark.parametrize("words", [
    ["raysoft", "run", "jobs/fedsoft_synthetic.yaml", "--set", "callbacks=[{name: mlflow}]"],
    ["raysoft", "run", "my job.yaml", "--set", "output.dir=it's here", "--out", "/a b/$HOME"],
])
def test_a_jobs_entrypoint_keeps_every_word_whole(words):
    # the words were joined with spaces: a Job's shell split `callbacks=[{name: mlflow}]` in two
    import shlex

    from raysoft.submit import entrypoint_line

    assert shlex.split(entrypoint_line(words)) == words


def test_run_with_a_jobs_address_submits_its_words_once_quoted(monkeypatch, tmp_path):
    import raysoft.submit
    from raysoft.cli import main

    sent: list[list[str]] = []
    monkeypatch.setattr(raysoft.submit, "submit", lambda address, entry, **kw: sent.append(entry) or 0)
    monkeypatch.chdir(ROOT)
    rc = main(["run", "jobs/fedsoft_synthetic.yaml", "--set", "output.dir=my runs", "--address", LOCAL])
    assert rc == 0
    assert sent == [["raysoft", "run", "jobs/fedsoft_synthetic.yaml", "--set", "output.dir=my runs",
                     "--out", str(ROOT / "my runs")]]


def test_raysoft_submit_is_a_command(monkeypatch):
    # docs/plugins.md said "`raysoft submit` uploads its working directory": invalid choice: 'submit'
    import raysoft.submit
    from raysoft.cli import main

    sent: list[tuple] = []
    monkeypatch.setattr(raysoft.submit, "submit", lambda address, entry, *a: sent.append((address, entry, a)) or 0)
    assert main(["submit", "--address", LOCAL, "--working-dir", "here", "--", "python", "-c", "print(1)"]) == 0
    assert sent == [(LOCAL, ["python", "-c", "print(1)"], (None, "here", None, True, 30.0))]


def test_a_submission_follows_the_jobs_own_lines_without_rays(monkeypatch, capsys):
    # every Job printed Ray's "Directory '.git' is now ignored" (twice), its job manager's INFO lines
    # and "INFO sdk.py:520 -- WebSocket closed"
    import logging

    import ray.job_submission

    import raysoft.backends.auth
    import raysoft.backends.join
    from raysoft import quiet
    from raysoft.submit import submit

    monkeypatch.delenv(quiet.ASK, raising=False)
    said: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    catch = Catch(logging.DEBUG)
    for name in ("ray._private.runtime_env.working_dir", "ray.dashboard.modules.job.sdk"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.INFO)
        logging.getLogger(name).addHandler(catch)

    class Client:
        def __init__(self, address):
            pass

        def submit_job(self, **kw):
            logging.getLogger("ray._private.runtime_env.working_dir").warning(
                "Directory %r is now ignored by default when packaging the working directory.", ".git")
            return "raysoft-job-1"

        async def tail_job_logs(self, job):
            yield ("2026-12-07 03:00:00,001\tINFO job_manager.py:581 -- Runtime env is setting up.\n"
                   "fedsoft round 0/4  elapsed 0m01s  best center mse dist 0 12.0\n")
            logging.getLogger("ray.dashboard.modules.job.sdk").info("WebSocket closed for job raysoft-job-1")

        def get_job_info(self, job):
            return type("Info", (), {"status": ray.job_submission.JobStatus.SUCCEEDED})()

    monkeypatch.setattr(raysoft.backends.join, "probe", lambda *a: None)
    monkeypatch.setattr(raysoft.backends.auth, "prepare", lambda *a: None)
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    try:
        assert submit(LOCAL, ["raysoft", "run", "job.yaml"], runtime_env="/nonexistent") == 0
        assert capsys.readouterr().out == "fedsoft round 0/4  elapsed 0m01s  best center mse dist 0 12.0\n"
        assert said == []
        monkeypatch.setenv(quiet.ASK, "1")  # the documented switch keeps them
        assert submit(LOCAL, ["raysoft", "run", "job.yaml"], runtime_env="/nonexistent") == 0
        assert "INFO job_manager.py:581" in capsys.readouterr().out
        assert said == ["Directory '.git' is now ignored by default when packaging the working directory.",
                        "WebSocket closed for job raysoft-job-1"]
    finally:
        for name in ("ray._private.runtime_env.working_dir", "ray.dashboard.modules.job.sdk"):
            logging.getLogger(name).removeHandler(catch)
