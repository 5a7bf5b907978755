"""raysoft report through the CLI: the figures hold the run's numbers; bad paths fail cleanly."""

import subprocess
import sys

import numpy as np
import pytest
from support.configs import check_png, small_config

import raysoft
from raysoft.report import load_run, plot_center_metric, plot_final_weights


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return raysoft.run(small_config(), out=tmp_path_factory.mktemp("rep")).run_dir


def test_center_metric_lines_are_the_metrics_table(run_dir):
    run = load_run(run_dir)
    fig = plot_center_metric(run)
    m = run.metrics
    for ax, d in zip(fig.axes, (0, 1)):
        for line in ax.get_lines():
            c = int(line.get_gid().split("-")[1])
            want = m[(m.scope == "cluster") & (m.metric == "mse") & (m.eval_dist == d) & (m.entity == c)]
            np.testing.assert_allclose(line.get_ydata(), want.sort_values("step").value.to_numpy())
        assert len(ax.get_lines()) == 2  # one line per center


def test_final_weights_figure_has_one_point_per_client(run_dir):
    fig = plot_final_weights(load_run(run_dir))
    xs = np.concatenate([np.asarray(c.get_offsets())[:, 0] for ax in fig.axes for c in ax.collections])
    assert set(xs.astype(int)) == set(range(10))


def test_cli_report_writes_pngs_and_markdown(run_dir):
    proc = subprocess.run([sys.executable, "-m", "raysoft", "report", str(run_dir)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(run_dir)
    for name in ("center_metric.png", "weights_by_group.png", "final_weights.png"):
        check_png(run_dir / name)
    assert "fedsoft" in (run_dir / "report.md").read_text()


def test_cli_report_on_a_non_run_is_one_line_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "raysoft", "report", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
