"""raysoft report on asynchronous stream runs (CCFL, FedSoft-Async, Local as a stream): the
CCFL paper's Figure 3 curves and Figure 4(b) KL bars hold the numbers of metrics.parquet, the
Markdown lists the summary's Cli Bfr / Cli Aft / Cluster / KL, and the synchronous figures that do
not apply to a stream are skipped with a reason."""

import shutil

import numpy as np
import pandas as pd
import pytest
from support.configs import check_png, small_config, stream_config
from support.images import write_fmnist

import raysoft
from raysoft import report as rp

pytestmark = pytest.mark.slow  # the module's runs take several seconds to make


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """CCFL, FedSoft-Async (each reported on its own), a no-drift CCFL and a synchronous FedSoft run."""
    fm = tmp_path_factory.mktemp("fm")
    write_fmnist(fm)
    out = tmp_path_factory.mktemp("runs")
    dirs = {
        "ccfl": raysoft.run(stream_config(fm), out=out).run_dir,
        "fedsoft_async": raysoft.run(stream_config(fm, "fedsoft_async"), out=out).run_dir,
        "no_drift": raysoft.run(stream_config(fm, drift=False), out=out).run_dir,
        "fedsoft": raysoft.run(small_config(), out=out).run_dir,
        "local_stream": raysoft.run(stream_config(fm, "local_stream"), out=out).run_dir,
    }
    return dirs


@pytest.fixture(scope="module")
def written(runs):
    return {name: rp.report([d]) for name, d in runs.items()}


def _lines(ax):
    return {line.get_gid(): (np.asarray(line.get_xdata()), np.asarray(line.get_ydata())) for line in ax.get_lines()}


def _client(m, metric):
    return m[(m.scope == "client") & (m.metric == metric)]


def _expected_curves(m):
    """Figure 3 computed directly from metrics.parquet, independently of raysoft.report."""
    before = _client(m, "accuracy_before").copy()
    before["cycle"] = before.groupby("entity").step.rank(method="first").astype(int)
    cycle_of = {(int(r.entity), int(r.step)): int(r.cycle) for r in before.itertuples()}
    after = _client(m, "accuracy_after").copy()
    after["cycle"] = [cycle_of[(int(e), int(s))] for e, s in zip(after.entity, after.step)]  # KeyError: misfiled
    own = m[(m.scope == "cluster") & (m.metric == "accuracy") & (m.entity == m.eval_dist)]
    cluster = own.groupby("step").value.mean()
    return {
        "cli_bfr": before.groupby("cycle").value.mean(),
        "cli_aft": after.groupby("cycle").value.mean(),
        "cluster": pd.Series(cluster.to_numpy(), index=cluster.index.to_numpy() / before.entity.nunique()),
        "clients": before.groupby("cycle").entity.nunique(),
    }


# ---------------------------------------------------------------------------- one stream run
@pytest.mark.parametrize("name", ["ccfl", "fedsoft_async"])
def test_a_stream_run_gets_figure_3_and_skips_what_does_not_apply(runs, written, name):
    d = runs[name]
    files = ["center_metric.png", "final_weights.png", "ccfl_accuracy.png", "staleness.png", "clustering.png",
             "client_metrics.png", "metric_vs_bytes.png"]
    assert written[name] == [d / f for f in [*files, "report.md"]]
    for f in files:
        check_png(d / f)
    assert not (d / "weights_by_group.png").exists()  # drifting mixtures: nothing to group by
    run = rp.load_run(d)
    assert run.is_stream and rp.mixture_drifts(run)
    assert rp.plot_weights_by_group(run) is None
    text = (d / "report.md").read_text()
    assert "`weights_by_group.png` skipped: the clients' true mixtures drift" in text
    assert "](ccfl_accuracy.png)" in text and "Figure 3" in text
    assert "global epoch t (uploads)" in rp.plot_center_metric(run).axes[0].get_xlabel()


@pytest.mark.parametrize("name", ["ccfl", "fedsoft_async"])
def test_figure_3_curves_are_the_metrics_table(runs, name):
    run = rp.load_run(runs[name])
    m = pd.read_parquet(runs[name] / "metrics.parquet")
    expect = _expected_curves(m)
    fig = rp.plot_stream_accuracy(run)
    ax, twin = fig.axes
    lines = _lines(ax)
    assert sorted(lines) == ["cli_aft", "cli_bfr", "cluster"]
    for key in ("cli_bfr", "cli_aft", "cluster"):
        x, y = lines[key]
        np.testing.assert_allclose(x, expect[key].index.to_numpy(), err_msg=key)
        np.testing.assert_allclose(y, expect[key].to_numpy(), err_msg=key)
    (count,) = twin.get_lines()
    assert count.get_gid() == "clients"
    np.testing.assert_array_equal(count.get_xdata(), expect["clients"].index)
    np.testing.assert_array_equal(count.get_ydata(), expect["clients"].to_numpy())

    # the cycles are the clients' k-th uploads: 24 uploads over 6 clients; every client's first
    # upload is cycle 1, the cluster curve starts at the pre-trained models (step 0, cycle 0)
    assert expect["clients"].sum() == 24 and expect["clients"].iloc[0] == 6 == m[m.scope == "client"].entity.nunique()
    np.testing.assert_allclose(lines["cluster"][0], [0, 8 / 6, 16 / 6, 24 / 6])
    # weighted by the clients per cycle, the curves average to the summary's means over all uploads
    s = run.summary
    bfr = expect["cli_bfr"]
    assert (bfr * expect["clients"]).sum() / expect["clients"].sum() == pytest.approx(s["cli_bfr_all_uploads"])
    aft = _client(m, "accuracy_after")
    assert aft.value.mean() == pytest.approx(s["cli_aft_all_uploads"])
    assert len(aft) == 24  # every upload gets its Cli Aft (the last replies are scored at the end)
    # Table 1's Cli Bfr / Cli Aft: each client's final upload; Cluster: over all evaluations
    before = _client(m, "accuracy_before")
    assert before.sort_values("step").groupby("entity").value.last().mean() == pytest.approx(s["cli_bfr"])
    assert aft.sort_values("step").groupby("entity").value.last().mean() == pytest.approx(s["cli_aft"])
    final = m[(m.scope == "cluster") & (m.metric == "accuracy") & (m.entity == m.eval_dist) & (m.step == 24)]
    assert lines["cluster"][1][-1] == pytest.approx(final.value.mean()) == pytest.approx(s["cluster_acc_final"])
    assert np.mean(lines["cluster"][1]) == pytest.approx(s["cluster_acc"])


def test_report_md_lists_the_stream_numbers(runs, written):
    run = rp.load_run(runs["ccfl"])
    s = run.summary
    text = (runs["ccfl"] / "report.md").read_text()
    assert "asynchronous stream of 24 uploads" in text and "24 rounds" not in text
    for key in ("cli_bfr", "cli_aft", "cluster_acc", "kl"):
        assert f"(`{key}`)" in text
    row = f"| {100 * s['cli_bfr']:.1f}% | {100 * s['cli_aft']:.1f}% | {100 * s['cluster_acc']:.1f}% | {s['kl']:.4f} |"
    assert row in text
    assert "(`bytes_down_per_client`)" in text
    assert rp.markdown._bytes(s["bytes_down_per_client"]) in text
    assert "cluster model k belongs to distribution k by construction" in text


def test_a_stream_matches_cluster_k_to_distribution_k(runs):
    """Cluster k is pre-trained on distribution k and the KL compares u_k with share k: the figures
    use that matching, not the summary's accuracy-based one; Figure 2 compares each client's last
    estimate with the true mixture of the same upload."""
    run = rp.load_run(runs["ccfl"])
    assert run.matching == {0: 0, 1: 1, 2: 2}
    fig = rp.plot_final_weights(run)
    (ax,) = fig.axes
    est, truth = ax.collections
    w, c = run.weights, run.clients
    last = w[w.step == w.groupby("client").step.transform("max")]
    last0 = last[last.center == 0].sort_values("client")
    np.testing.assert_allclose(est.get_offsets(), last0[["client", "estimate"]].to_numpy())
    c_last = c[(c.step == c.groupby("client").step.transform("max")) & (c.distribution == 0)].sort_values("client")
    np.testing.assert_array_equal(c_last.step.to_numpy(), last0.step.to_numpy())  # the same upload
    np.testing.assert_allclose(truth.get_offsets(), c_last[["client", "share"]].to_numpy())
    assert "center 0 (matched to distribution 0)" in ax.get_title()


def test_a_stream_without_drift_keeps_figure_1_bottom(runs, written):
    run = rp.load_run(runs["no_drift"])
    assert run.is_stream and not rp.mixture_drifts(run)
    assert (runs["no_drift"] / "weights_by_group.png").exists()
    fig = rp.plot_weights_by_group(run)
    assert len(fig.axes) == 3 and fig.axes[0].get_xlabel() == "global epoch t (uploads)"


def test_local_stream_draws_only_cli_bfr(runs, written):
    d = runs["local_stream"]
    assert written["local_stream"] == [d / f for f in ["ccfl_accuracy.png", "client_metrics.png", "metric_vs_bytes.png",
                                                          "report.md"]]
    check_png(d / "ccfl_accuracy.png")
    run = rp.load_run(d)
    m = run.metrics
    ax = rp.plot_stream_accuracy(run).axes[0]
    lines = _lines(ax)
    expect = _expected_curves(m)
    assert set(lines) == {"cli_bfr"} | ({"cli_aft"} if len(expect["cli_aft"]) else set()) | (
        {"cluster"} if len(expect["cluster"]) else set())
    np.testing.assert_allclose(lines["cli_bfr"][1], expect["cli_bfr"].to_numpy())
    text = (d / "report.md").read_text()
    assert "](ccfl_accuracy.png)" in text and "`center_metric.png` skipped" in text


def test_a_synchronous_run_has_no_stream_figure(runs, written):
    run = rp.load_run(runs["fedsoft"])
    assert not run.is_stream
    assert rp.plot_stream_accuracy(run) is None and rp.stream_accuracy(run) == {}
    assert written["fedsoft"] == [runs["fedsoft"] / f for f in
                                  ["center_metric.png", "weights_by_group.png", "final_weights.png", "clustering.png",
                                   "client_metrics.png", "metric_vs_bytes.png", "report.md"]]
    text = (runs["fedsoft"] / "report.md").read_text()
    assert "ccfl_accuracy" not in text and "skipped" not in text and "Cli Bfr" not in text
    assert rp.plot_center_metric(run).axes[0].get_xlabel() == "round"
    assert run.matching == run.summary_matching


# ---------------------------------------------------------------------------- several runs
def test_comparison_of_ccfl_and_fedsoft_async_has_the_kl_bars(runs, written, tmp_path):
    out = tmp_path / "cmp"
    names = ["ccfl", "fedsoft_async"]
    files = rp.report([runs[n] for n in names], out=out)
    assert files[-1] == out / "comparison_report.md"
    assert {out / "comparison_center_metric.png", out / "comparison_kl.png"} <= set(files)
    check_png(out / "comparison_kl.png")

    loaded = [rp.load_run(runs[n]) for n in names]
    fig = rp.plot_kl_comparison(loaded)
    (ax,) = fig.axes
    bars = ax.patches
    assert [b.get_gid() for b in bars] == [r.name for r in loaded]
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    for bar, n in zip(bars, names):
        m = pd.read_parquet(runs[n] / "metrics.parquet")
        kl = _client(m, "kl").value
        assert len(kl) == 24  # one per upload
        assert bar.get_height() == pytest.approx(kl.mean())
        assert bar.get_height() == pytest.approx(rp.load_run(runs[n]).summary["kl"])

    text = (out / "comparison_report.md").read_text()
    assert "](comparison_kl.png)" in text
    stream_rows = [line for line in text.split("## Streams")[1].splitlines() if line.startswith("| [")]
    assert len(stream_rows) == 2
    ref = _client(pd.read_parquet(runs["fedsoft_async"] / "metrics.parquet"), "kl").value.mean()
    for row, r in zip(stream_rows, loaded):
        s = r.summary
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[1] == r.algorithm
        assert cells[2:6] == [f"{s['cli_bfr']:.3f}", f"{s['cli_aft']:.3f}", f"{s['cluster_acc']:.3f}", f"{s['kl']:.4f}"]
        assert cells[6] == f"{rp.mean_kl(r) / ref:.3f}"  # KL relative to FedSoft-Async's (Figure 4(b))
    assert stream_rows[1].split("|")[7].strip() == "1.000"


def test_repeated_algorithms_are_labelled_with_the_run_name(runs, written, tmp_path):
    twin = tmp_path / "ccfl-again"
    shutil.copytree(runs["ccfl"], twin)
    loaded = [rp.load_run(runs["ccfl"]), rp.load_run(twin), rp.load_run(runs["fedsoft_async"])]
    ax = rp.plot_kl_comparison(loaded).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        f"ccfl ({runs['ccfl'].name})", "ccfl (ccfl-again)", "fedsoft_async"]


def test_kl_bars_skip_runs_without_kl_and_need_two_streams(runs, written, tmp_path):
    # one stream run and one synchronous run: no KL figure, but the stream's row is there
    out = tmp_path / "one"
    files = rp.report([runs["fedsoft"], runs["ccfl"]], out=out)
    assert not (out / "comparison_kl.png").exists()
    assert files[-1] == out / "comparison_report.md" and out / "comparison_center_metric.png" in files
    text = (out / "comparison_report.md").read_text()
    assert "## Streams" in text and "comparison_kl.png" not in text
    assert "round (streams: global epoch t)" in rp.plot_comparison(
        [rp.load_run(runs["fedsoft"]), rp.load_run(runs["ccfl"])]).axes[0].get_xlabel()
    out = tmp_path / "local"
    rp.report([runs["ccfl"], runs["local_stream"]], out=out)
    check_png(out / "comparison_kl.png")
    loaded = [rp.load_run(runs["ccfl"]), rp.load_run(runs["local_stream"])]
    (ax,) = rp.plot_kl_comparison(loaded).axes
    assert [b.get_gid() for b in ax.patches] == [runs["ccfl"].name]
    assert "not in the KL figure: " + runs["local_stream"].name in (out / "comparison_report.md").read_text()
