"""The analysis scripts (analysis/: the tables of the docs) refuse a bad ``--set`` or option before
their first run: one argparse line, exit 2, nothing written; they start, and every name they import
from raysoft exists."""

import subprocess
import sys

import pytest
from support.paths import ANALYSIS


@pytest.mark.parametrize("script, args", [
    ("fpfc_table1.py", ["--methods", "ifca", "--seeds", "0"]),
    ("fedsoft_synthetic_tables.py", ["--seeds", "0"]),
    ("fedsoft_fmnist_sweep.py", ["--fedavg"]),
    ("ccfl_table1.py", ["--ks", "2"]),
    ("ccfl_pretraining_epochs.py", ["--epochs", "1"]),
    ("bench_round_times.py", ["W1"]),
    ("fpfc_pair_norms.py", []),
    ("ccfl_staleness.py", ["--variant", "x: algorithm.a=0"]),
])
@pytest.mark.slow
def test_a_bad_override_is_one_line_before_any_run(script, args, tmp_path):
    proc = subprocess.run([sys.executable, str(ANALYSIS / script), *args, "--set", "algorithm.bogus=1"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}: error: algorithm.bogus:"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ccfl_staleness_the_clocks_that_never_throttle_give_the_run_without_staleness(tmp_path):
    """analysis/ccfl_staleness.py on a tiny stream: a = 0 (alpha2 = 1), b = the number of clients, and
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
        [sys.executable, str(ANALYSIS / "ccfl_staleness.py"), "--job", str(job), "--out", str(tmp_path / "runs"),
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


@pytest.mark.parametrize("script", ["two_actor_rates.py", "trim_memory_cost.py", "ccfl_upload_anatomy.py",
                                    "fedsoft_ray_overhead.py"])
@pytest.mark.slow
def test_the_measurement_scripts_start(script, tmp_path):
    """The performance scripts docs/performance.md quotes (minutes each, run by hand) import and parse
    their options."""
    proc = subprocess.run([sys.executable, str(ANALYSIS / script), "--help"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:") and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script, args, message", [
    ("two_actor_rates.py", ["--repeats", "0"], "--repeats: calls timed per process, at least 1 (got 0)"),
    ("trim_memory_cost.py", ["--pairs", "0"], "--pairs: runs of each setting, at least 1 (got 0)"),
    ("trim_memory_cost.py", ["--workload", "W9"], "--workload: unknown workload 'W9' (known: W1, W2, W3, W4, W5)"),
    ("fedsoft_ray_overhead.py", ["--rounds", "0"], "--rounds: rounds of each run, at least 1 (got 0)"),
])
@pytest.mark.slow
def test_the_measurement_scripts_refuse_bad_options_in_one_line(script, args, message, tmp_path):
    proc = subprocess.run([sys.executable, str(ANALYSIS / script), *args], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f"{script}: error: {message}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", sorted(p.name for p in ANALYSIS.glob("*.py")))
def test_every_name_an_analysis_script_imports_from_raysoft_exists(script):
    # analysis/fedavg_cnn_round_anatomy.py (then jobs/w2_anatomy.py) imported a function that had been
    # removed from raysoft.bench, unnoticed until it was run; a name moved or removed is now found here
    import ast
    import importlib
    import importlib.util

    tree = ast.parse((ANALYSIS / script).read_text())
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "raysoft":
            module = importlib.import_module(node.module)
            missing += [f"{node.module}.{a.name}" for a in node.names
                        if not hasattr(module, a.name) and not (
                            hasattr(module, "__path__") and importlib.util.find_spec(f"{node.module}.{a.name}"))]
    assert not missing, f"{script} imports names raysoft does not have: {missing}"
