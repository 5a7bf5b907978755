"""Joining a cluster ends within ray.join_timeout_s, with one line, whatever the address form;
a Ray Job that fails says why."""

import http.server
import os
import socket
import subprocess
import sys
import threading

import pytest
import yaml
from support.configs import small_config

from raysoft.backends.join import endpoint, probe, speaks
from raysoft.errors import JoinError, exit_code
from raysoft.submit import EXCLUDES, failure_line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port():
    """A port where a socket accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


@pytest.mark.parametrize("address, expected", [
    ("10.0.0.5:6379", ("", "10.0.0.5", 6379)),
    ("head", ("", "head", 6379)),
    ("ray://head:10001", ("ray", "head", 10001)),
    ("ray://head", ("ray", "head", 10001)),
    ("http://127.0.0.1:8265", ("http", "127.0.0.1", 8265)),
    ("https://ray.example.org", ("https", "ray.example.org", 443)),
    ("[::1]:6379", ("", "::1", 6379)),
])
def test_the_endpoint_of_every_address_form(address, expected):
    assert endpoint(address) == expected


@pytest.mark.parametrize("address, message", [
    ("127.0.0.1:99999", "the port is not a number"),
    ("ray://:10001", "no host"),
    ("grpc://head:1", "unknown scheme 'grpc'"),
])
def test_a_malformed_address_is_one_line(address, message):
    with pytest.raises(JoinError, match=message) as err:
        endpoint(address)
    assert exit_code(err.value) == 2 and "\n" not in str(err.value)


@pytest.mark.parametrize("scheme", ["", "ray://", "http://"])
def test_nothing_listening_is_refused_within_the_deadline(scheme):
    port = _free_port()
    with pytest.raises(JoinError) as err:
        probe(f"{scheme}127.0.0.1:{port}", timeout_s=0.5)
    msg = str(err.value)
    assert f"ray.address {scheme}127.0.0.1:{port}" in msg and "did not answer within 0.5 s" in msg
    assert "connection refused" in msg and "ray.join_timeout_s" in msg


@pytest.mark.parametrize("scheme, what", [("", "the head's GCS"), ("ray://", "the Ray Client server"),
                                          ("http://", "the Jobs API (dashboard)")])
def test_a_port_that_accepts_but_does_not_speak_is_refused(silent_port, scheme, what):
    with pytest.raises(JoinError, match="accepts connections there but does not speak its protocol") as err:
        probe(f"{scheme}127.0.0.1:{silent_port}", timeout_s=0.5)
    assert what in str(err.value)


def test_a_grpc_server_and_an_http_server_answer():
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        probe(f"127.0.0.1:{port}", timeout_s=10)  # returns: a gRPC handshake completes
        assert speaks("ray", "127.0.0.1", port, 10)
    finally:
        server.stop(None)

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401)  # a cluster with token authentication answers 401
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        probe(f"http://127.0.0.1:{httpd.server_address[1]}", timeout_s=10)
    finally:
        httpd.shutdown()


def test_auto_without_a_cluster_is_one_line(monkeypatch):
    import raysoft.backends.join as join

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(join, "resolve_auto", lambda: None)
    with pytest.raises(JoinError, match="ray.address auto: no Ray cluster was started on this machine"):
        probe("auto", timeout_s=1)


# --------------------------------------------------------------------------- the command line
def _run_cli(tmp_path, *args, env=None):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config()))
    out = tmp_path / "out"
    # a deadline of the test, not a timing: before, raysoft waited for minutes with Ray's warnings
    return subprocess.run([sys.executable, "-m", "raysoft", "run", str(cfg), "--out", str(out),
                           "--set", "ray.backend=ray", "--set", "ray.join_timeout_s=1", *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}), out


@pytest.mark.slow
@pytest.mark.parametrize("form", ["gcs", "RAY_ADDRESS", "ray://", "http://"])
def test_an_unreachable_cluster_ends_the_run_with_one_line(tmp_path, silent_port, form):
    port = _free_port() if form != "gcs" else silent_port
    address = {"gcs": f"127.0.0.1:{port}", "RAY_ADDRESS": f"127.0.0.1:{port}", "ray://": f"ray://127.0.0.1:{port}",
               "http://": f"http://127.0.0.1:{port}"}[form]
    if form == "RAY_ADDRESS":
        proc, out = _run_cli(tmp_path, env={"RAY_ADDRESS": address})
        source = "RAY_ADDRESS"
    else:
        proc, out = _run_cli(tmp_path, "--address", address)
        source = "ray.address"
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"raysoft: error: {source} {address}: "), proc.stderr
    assert "did not answer within 1 s" in lines[0]
    assert not out.exists() or not list(out.iterdir())


# --------------------------------------------------------------------------- Ray Jobs
def test_a_failed_job_says_why_in_one_line():
    message = ("Failed to set up runtime environment.\nTraceback (most recent call last):\n  File ...\n"
               "RuntimeError: Failed to download runtime_env file package gcs://_ray_pkg_1.zip")
    line = failure_line("raysubmit_1", "FAILED", "RUNTIME_ENV_SETUP_FAILURE", message, "")
    assert line == ("job raysubmit_1: FAILED: RUNTIME_ENV_SETUP_FAILURE: Failed to set up runtime environment.; "
                    "it wrote no log")
    line = failure_line("raysubmit_2", "FAILED", None, "Job entrypoint command failed with exit code 2",
                        "starting\nraysoft: error: data: no such file\n\n")
    assert line == ("job raysubmit_2: FAILED: Job entrypoint command failed with exit code 2; its last log line: "
                    "raysoft: error: data: no such file")
    assert len(failure_line("j", "FAILED", None, "x" * 5000, "")) < 400


def test_run_output_and_logs_are_not_uploaded(monkeypatch, tmp_path):
    import raysoft.backends.join as join
    import raysoft.submit as submit_mod

    sent = {}

    class FakeClient:
        def __init__(self, address):
            pass

        def submit_job(self, entrypoint, runtime_env, submission_id):
            sent.update(runtime_env)
            return "raysubmit_x"

    import ray.job_submission

    monkeypatch.setattr(join, "speaks", lambda *a: True)
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", FakeClient)
    env_file = tmp_path / "env.yaml"
    env_file.write_text("excludes: [data/]\n")
    with socket.socket() as s:  # something to accept the probe's connection
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        rc = submit_mod.submit(f"http://127.0.0.1:{s.getsockname()[1]}", ["raysoft", "run", "c.yaml"],
                               runtime_env=str(env_file), working_dir=str(tmp_path), follow=False)
    assert rc == 0 and sent["working_dir"] == str(tmp_path)
    assert sent["excludes"][0] == "data/" and set(EXCLUDES) <= set(sent["excludes"])
    assert {"runs/", "*.log"} <= set(sent["excludes"])
