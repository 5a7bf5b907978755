"""raysoft report: the figures (valid PNGs whose plotted data equal the run's tables), report.md,
the multi-run comparison and the CLI's error path."""

import re
import shutil

import numpy as np
import pandas as pd
import pytest
from support.configs import check_png, small_config

import raysoft
from raysoft import report as rp
from raysoft.cli import main as cli_main

PER_RUN = ["center_metric.png", "weights_by_group.png", "final_weights.png", "clusters.png"]


def _fpfc_config():
    """FPFC on its synthetic data, small enough for a few seconds (it need not find the clusters)."""
    return raysoft.load_config("jobs/fpfc_synthetic.yaml", [
        "ray.backend=inprocess", "algorithm.rounds=20", "algorithm.eval_every=10", "data.clients=10",
        "data.distributions=2", "algorithm.clients_per_round=4", "data.test_samples=100",
        "train.local_epochs=2", "output.progress=none"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny FedSoft (synthetic, 10:90), FedAvg, Local and FPFC runs, in-process."""
    out = tmp_path_factory.mktemp("runs")
    dirs = {
        "fedsoft": raysoft.run(small_config(), out=out).run_dir,
        "fedavg": raysoft.run(small_config(algorithm={"name": "fedavg"}), out=out).run_dir,
        "local": raysoft.run(small_config(algorithm={"name": "local"}), out=out).run_dir,
        "fpfc": raysoft.run(_fpfc_config(), out=out).run_dir,
    }
    return dirs


@pytest.fixture(scope="module")
def written(runs):
    """Each run reported on its own: {name: files written}."""
    return {name: rp.report([d]) for name, d in runs.items()}


def _ydata(ax):
    return {line.get_gid(): (line.get_xdata(), line.get_ydata()) for line in ax.get_lines()}


# ---------------------------------------------------------------------------- files
def test_each_run_gets_its_figures_and_report(runs, written):
    served = ["client_metrics.png", "metric_vs_bytes.png"]  # every run scores its clients and counts bytes
    expect = {
        "fedsoft": ["center_metric.png", "weights_by_group.png", "final_weights.png", "clustering.png", *served],
        "fedavg": ["center_metric.png", *served],
        "local": served,
        "fpfc": ["center_metric.png", "weights_by_group.png", "final_weights.png", "clusters.png", "clustering.png",
                 *served],
    }
    for name, files in expect.items():
        assert written[name] == [runs[name] / f for f in [*files, "report.md"]]
        for f in files:
            check_png(runs[name] / f)
        for f in set(PER_RUN) - set(files):
            assert not (runs[name] / f).exists()


def test_report_md_summarises_the_run(runs, written):
    text = (runs["fedsoft"] / "report.md").read_text()
    s = rp.load_run(runs["fedsoft"]).summary
    assert "**fedsoft**" in text and "4 rounds" in text
    for d in s["distributions"]:
        assert f"| {d['distribution']} | {d['best_center']} | {d['mse']:.2f} |" in text
    assert f"{s['weight_mae']:.4f}" in text
    assert f"mse {s['local_mean']['mse']:.2f}" in text
    for f in ("center_metric.png", "weights_by_group.png", "final_weights.png"):
        assert f"]({f})" in text
    # no ARI of its own (a soft method); the clustering figure's caption names the table's ARI
    assert "skipped" not in text and re.search(r"ARI [-\d]", text) is None

    fpfc = (runs["fpfc"] / "report.md").read_text()
    sf = rp.load_run(runs["fpfc"]).summary
    assert f"ARI {sf['ari']:.3f}, {sf['num_clusters']} clusters" in fpfc
    assert "](clusters.png)" in fpfc and "test_accuracy" in fpfc


def test_fedavg_without_weights_skips_the_weight_figures(runs, written):
    run = rp.load_run(runs["fedavg"])
    assert run.weights.empty and run.shape.models == "global"
    assert rp.plot_weights_by_group(run) is None and rp.plot_final_weights(run) is None
    text = (runs["fedavg"] / "report.md").read_text()
    assert "](center_metric.png)" in text
    assert "weights_by_group.png" not in text and "final_weights.png" not in text  # not a clustered algorithm
    (ax,) = rp.plot_center_metric(run).axes  # FedAvg: the global model, one line per distribution
    m = run.metrics
    c = m[(m.scope == "cluster") & (m.metric == "mse")]
    assert c.entity.unique().tolist() == [0]
    for line in ax.get_lines():
        d = int(line.get_gid().split("-")[1])
        np.testing.assert_array_equal(line.get_ydata(), c[c.eval_dist == d].sort_values("step").value)
    assert sorted(line.get_gid() for line in ax.get_lines()) == ["dist-0", "dist-1"]


def test_local_without_centers_skips_every_figure(runs, written):
    run = rp.load_run(runs["local"])
    assert rp.plot_center_metric(run) is None
    text = (runs["local"] / "report.md").read_text()
    assert "No centers" in text and "`center_metric.png` skipped" in text


# ---------------------------------------------------------------------------- figure content
def test_center_metric_plots_every_center_on_every_distribution(runs):
    run = rp.load_run(runs["fedsoft"])
    m = run.metrics
    cluster = m[(m.scope == "cluster") & (m.metric == "mse")]
    fig = rp.plot_center_metric(run)
    dists = sorted(cluster.eval_dist.unique())
    assert [ax.get_title() for ax in fig.axes] == [f"distribution {d}" for d in dists]
    for ax, d in zip(fig.axes, dists):
        lines = _ydata(ax)
        assert len(lines) == cluster.entity.nunique() == 2
        for c in range(2):
            expect = cluster[(cluster.eval_dist == d) & (cluster.entity == c)].sort_values("step")
            x, y = lines[f"center-{c}"]
            np.testing.assert_array_equal(x, expect.step)
            np.testing.assert_array_equal(y, expect.value)


def test_weights_by_group_averages_clients_with_the_same_mixture(runs):
    run = rp.load_run(runs["fedsoft"])
    w, c = run.weights, run.clients
    share0 = c[c.distribution == 0].set_index("client").share
    group = (share0 > 0.5).map({True: "90:10", False: "10:90"})  # 10:90 partition: two mixtures
    fig = rp.plot_weights_by_group(run)
    matching = run.matching
    assert matching is not None
    assert len(fig.axes) == len(matching) == 2
    for ax, (d, center) in zip(fig.axes, sorted(matching.items())):
        assert ax.get_title() == f"distribution {d}: weight on center {center}"
        lines = _ydata(ax)
        assert sorted(lines) == ["10:90", "90:10"]
        last = run.summary["rounds"]
        for g, (x, y) in lines.items():
            sub = w[(w.center == center) & w.client.map(group).eq(g)]
            expect = sub.groupby("step").estimate.mean()
            assert expect.index[-1] < last  # the weights of the last estimation hold to the end: carried there
            np.testing.assert_array_equal(x, [*expect.index, last])
            np.testing.assert_allclose(y, [*expect.to_numpy(), expect.iloc[-1]])


def test_final_weights_are_the_last_estimates_on_the_first_cluster(runs):
    run = rp.load_run(runs["fedsoft"])
    w = run.weights
    c0 = run.matching[0]
    last = w[(w.step == w.step.max()) & (w.center == c0)].sort_values("client")
    fig = rp.plot_final_weights(run)
    (ax,) = fig.axes
    est, truth = ax.collections
    assert est.get_gid() == "estimate" and truth.get_gid() == "truth"
    np.testing.assert_array_equal(est.get_offsets()[:, 0], last.client)
    np.testing.assert_allclose(est.get_offsets()[:, 1], last.estimate)
    c = run.clients
    share0 = c[c.distribution == 0].sort_values("client")
    np.testing.assert_allclose(truth.get_offsets(), share0[["client", "share"]].to_numpy())
    assert f"final weight on center {c0} (matched to distribution 0)" in ax.get_title()


def test_clusters_plot_predicted_against_client_coloured_by_truth(runs):
    run = rp.load_run(runs["fpfc"])
    a = run.assignments.sort_values("client")
    fig = rp.plot_clusters(run)
    (ax,) = fig.axes
    assert [col.get_gid() for col in ax.collections] == [f"truth-{t}" for t in sorted(a.truth.unique())]
    for col in ax.collections:
        t = int(col.get_gid().split("-")[1])
        sub = a[a.truth == t]
        np.testing.assert_array_equal(col.get_offsets(), sub[["client", "predicted"]].to_numpy())
    s = run.summary
    assert f"ARI {s['ari']:.3f}" in ax.get_title() and f"{s['num_clusters']} clusters found" in ax.get_title()


def test_mixture_groups_bin_by_first_share_when_there_are_many_mixtures():
    n = 100
    s0 = (0.5 + np.arange(n)) / 100  # the linear partition
    linear = pd.DataFrame({0: s0, 1: 1 - s0}, index=pd.RangeIndex(n, name="client"))
    labels, order = rp.mixture_groups(linear)
    assert order == ["share0 0.0-0.2", "share0 0.2-0.4", "share0 0.4-0.6", "share0 0.6-0.8", "share0 0.8-1.0"]
    assert labels.value_counts().to_dict() == {g: 20 for g in order}
    two = pd.DataFrame({0: [0.09, 0.91, 0.12], 1: [0.91, 0.09, 0.88]})
    labels, order = rp.mixture_groups(two)
    assert order == ["10:90", "90:10"] and labels.tolist() == ["10:90", "90:10", "10:90"]


# ---------------------------------------------------------------------------- several runs
@pytest.mark.slow
def test_comparison_of_several_runs(runs, written, tmp_path):
    order = ["fedsoft", "fedavg", "fpfc", "local"]
    out = tmp_path / "cmp"
    files = rp.report([runs[n] for n in order], out=out)
    assert files[-1] == out / "comparison_report.md" and out / "comparison_center_metric.png" in files
    check_png(out / "comparison_center_metric.png")
    text = (out / "comparison_report.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    assert [r.split(" | ")[1] for r in rows] == order
    loaded = [rp.load_run(runs[n]) for n in order]
    for r, row in zip(loaded, rows):
        for d in r.summary.get("distributions") or []:
            assert f"({'global' if r.algorithm == 'fedavg' else d['best_center']})" in row
    assert f"{loaded[0].summary['weight_mae']:.4f}" in rows[0]
    assert f"{loaded[2].summary['ari']:.3f} ({loaded[2].summary['num_clusters']})" in rows[2]
    assert "No centers, so not in the figure" in text

    fig = rp.plot_comparison(loaded)
    # mse (FedSoft, FedAvg) and accuracy (FPFC): one row of panels per metric, 2 distributions each
    assert len(fig.axes) == 4
    for ax in fig.axes:
        metric = "accuracy" if "accuracy" in ax.get_ylabel() else "mse"
        lines = _ydata(ax)
        names = [r.name for r in loaded if r.metric == metric and r.algorithm != "local"]
        assert sorted(lines) == sorted(names)
        d = int(ax.get_title().split()[-1])
        for r in loaded:
            if r.name not in lines:
                continue
            m = r.metrics
            c = m[(m.scope == "cluster") & (m.metric == metric) & (m.eval_dist == d)]
            expect = c.groupby("step").value.min() if metric == "mse" else c.groupby("step").value.max()
            np.testing.assert_array_equal(lines[r.name][0], expect.index)
            np.testing.assert_allclose(lines[r.name][1], expect.to_numpy())


def test_main_prints_the_files_then_the_report_directory(runs, written, tmp_path, capsys):
    assert cli_main(["report", str(runs["fedsoft"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == str(runs["fedsoft"])
    assert lines[:-1] == [str(runs["fedsoft"] / f) for f in
                          ["center_metric.png", "weights_by_group.png", "final_weights.png", "clustering.png",
                           "client_metrics.png", "metric_vs_bytes.png", "report.md"]]
    out = tmp_path / "two"
    assert cli_main(["report", str(runs["fedsoft"]), str(runs["fedavg"]), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == str(out) and lines[-2] == str(out / "comparison_report.md")
    # default out: the first run's parent
    assert rp.report_dir([runs["fedsoft"], runs["fedavg"]]) == runs["fedsoft"].parent


def test_a_path_that_is_not_a_run_directory_is_an_error_and_nothing_is_written(runs, tmp_path, capsys):
    good = tmp_path / "good"
    shutil.copytree(runs["fedavg"], good)
    for f in (*PER_RUN, "report.md"):
        (good / f).unlink(missing_ok=True)
    before = sorted(p.name for p in good.iterdir())
    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(runs["fedavg"] / "metrics.parquet", half)
    out = tmp_path / "out"
    cases = [
        (tmp_path / "nope", "no such directory"),
        (half, "missing summary.json"),
        (tmp_path, "missing summary.json, metrics.parquet"),
    ]
    for bad, why in cases:
        assert cli_main(["report", str(good), str(bad), "--out", str(out)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        err = captured.err.splitlines()
        assert len(err) == 1 and str(bad) in err[0] and why in err[0]
        assert sorted(p.name for p in good.iterdir()) == before
        assert sorted(p.name for p in half.iterdir()) == ["metrics.parquet"]
        assert not out.exists()


def test_x_ticks_fall_on_the_evaluation_interval():
    """Evaluations every 5 rounds, 0..50: ticks every 5 (not 0, 6, ..., 48); longer runs a nice
    multiple of the interval; one step: matplotlib's own integer ticks."""
    from raysoft.report.figures import tick_spacing

    assert tick_spacing(range(0, 51, 5)) == 5
    assert tick_spacing(range(0, 201, 5)) == 25  # 40 intervals: 5 of them a tick
    assert tick_spacing([0, 3, 6, 9]) == 3
    assert tick_spacing(range(0, 2001, 80)) == 400
    assert tick_spacing([4]) is None
