"""The job scripts refuse a bad ``--set`` before their first run: one argparse line, exit 2,
nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest

JOBS = Path(__file__).resolve().parent.parent / "jobs"


@pytest.mark.parametrize("script, args", [
    ("fpfc_table.py", ["--methods", "ifca", "--seeds", "0"]),
    ("fedsoft_tables.py", ["--seeds", "0"]),
    ("fedsoft_fmnist_sweep.py", ["--fedavg"]),
    ("ccfl_table1.py", ["--ks", "2"]),
    ("ccfl_pretraining.py", ["--epochs", "1"]),
    ("round_times.py", ["W1"]),
    ("fpfc_pair_norms.py", []),
])
def test_a_bad_override_is_one_line_before_any_run(script, args, tmp_path):
    proc = subprocess.run([sys.executable, str(JOBS / script), *args, "--set", "algorithm.bogus=1"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}: error: algorithm.bogus:"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and list(tmp_path.iterdir()) == []
