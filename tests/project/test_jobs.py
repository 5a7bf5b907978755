"""The job scripts refuse a bad ``--set`` before their first run: one argparse line, exit 2,
nothing written."""

import subprocess
import sys

import pytest
from support.paths import JOBS


@pytest.mark.parametrize("script, args", [
    ("fpfc_table.py", ["--methods", "ifca", "--seeds", "0"]),
    ("fedsoft_tables.py", ["--seeds", "0"]),
    ("fedsoft_fmnist_sweep.py", ["--fedavg"]),
    ("ccfl_table1.py", ["--ks", "2"]),
    ("ccfl_pretraining.py", ["--epochs", "1"]),
    ("round_times.py", ["W1"]),
    ("fpfc_pair_norms.py", []),
    ("ccfl_variants.py", ["--variant", "x: algorithm.a=0"]),
])
@pytest.mark.slow
def test_a_bad_override_is_one_line_before_any_run(script, args, tmp_path):
    proc = subprocess.run([sys.executable, str(JOBS / script), *args, "--set", "algorithm.bogus=1"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}: error: algorithm.bogus:"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ccfl_variants_the_clocks_that_never_throttle_give_the_run_without_staleness(tmp_path):
    """jobs/ccfl_variants.py on a tiny stream: a = 0 (alpha2 = 1), b = the number of clients, and
    the client-cycle clock at b = 5 give the same run to the last digit (a fresh upload's gap is
    below N uploads, one cycle: docs/algorithms.md#ccfl-staleness-clock), and alpha2 = 1 for
    every update; the upload clock as written may throttle (its row has its own share)."""
    import yaml
    from support.configs import stream_config
    from support.images import write_fmnist

    write_fmnist(tmp_path / "fm")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(stream_config(tmp_path / "fm", rounds=30, eval_every=10)))
    proc = subprocess.run(
        [sys.executable, str(JOBS / "ccfl_variants.py"), "--job", str(job), "--out", str(tmp_path / "runs"),
         "--variant", "as written", "--variant", "no staleness: algorithm.a=0",
         "--variant", "b = N: algorithm.b=CLIENTS", "--variant", "cycles: algorithm.staleness_clock=client_cycles"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith("| ") and not line.startswith("| variant")}
    assert set(rows) == {"as written", "no staleness", "b = N", "cycles"}
    outcome = slice(0, 6)  # Cli Bfr, Cli Aft, clusters at the end, cluster_acc, KL, t - tau
    assert rows["no staleness"][outcome] == rows["b = N"][outcome] == rows["cycles"][outcome]
    assert rows["no staleness"][7] == rows["b = N"][7] == rows["cycles"][7] == "100%"  # alpha2 = 1


@pytest.mark.parametrize("script", ["side_by_side.py", "trim_cost.py", "w3_anatomy.py", "w4_backends.py"])
@pytest.mark.slow
def test_the_measurement_jobs_start(script, tmp_path):
    """The performance jobs docs/performance.md quotes (minutes each, run by hand) import and parse
    their options."""
    proc = subprocess.run([sys.executable, str(JOBS / script), "--help"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:") and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script, args, message", [
    ("side_by_side.py", ["--repeats", "0"], "--repeats: calls timed per process, at least 1 (got 0)"),
    ("trim_cost.py", ["--pairs", "0"], "--pairs: runs of each setting, at least 1 (got 0)"),
    ("trim_cost.py", ["--workload", "W9"], "--workload: unknown workload 'W9' (known: W1, W2, W3, W4, W5)"),
    ("w4_backends.py", ["--rounds", "0"], "--rounds: rounds of each run, at least 1 (got 0)"),
])
@pytest.mark.slow
def test_the_measurement_jobs_refuse_bad_options_in_one_line(script, args, message, tmp_path):
    proc = subprocess.run([sys.executable, str(JOBS / script), *args], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f"{script}: error: {message}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", sorted(p.name for p in JOBS.glob("*.py")))
def test_every_name_a_job_script_imports_from_raysoft_exists(script):
    # jobs/w2_anatomy.py imported a function that had been removed from raysoft.bench, unnoticed
    # until it was run; a name moved or removed is now found here
    import ast
    import importlib
    import importlib.util

    tree = ast.parse((JOBS / script).read_text())
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "raysoft":
            module = importlib.import_module(node.module)
            missing += [f"{node.module}.{a.name}" for a in node.names
                        if not hasattr(module, a.name) and not (
                            hasattr(module, "__path__") and importlib.util.find_spec(f"{node.module}.{a.name}"))]
    assert not missing, f"{script} imports names raysoft does not have: {missing}"
