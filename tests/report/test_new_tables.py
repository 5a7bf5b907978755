"""The figures over the newer tables (clustering.parquet, client_metrics.parquet, comm.parquet) and
the rules by which the report reads what a run has, on small run directories written here in
exactly the schemas of raysoft/results.py; each figure's data checked against numbers computed
by hand from the rows written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from raysoft import report as rp
from raysoft.report.figures import titles_fit
from raysoft.results import Recorder, write_tables

STEPS = (0, 2, 4)  # evaluations after 0, 2 and 4 rounds
CLIENTS = 4


def _run_dir(path, algorithm="ifca", *, global_model=False, weights=None, tables=None, metric="accuracy"):
    """A run directory of 4 rounds (evaluated at STEPS) on 2 distributions with 2 centers: its
    summary, metrics (cluster rows; with ``global_model`` the two centers are one model), the
    ``weights`` rows [(step, client, center, estimate)] and ``tables`` {name: [row dicts]}."""
    path.mkdir(parents=True)
    rec = Recorder(path.name)
    for s in STEPS:
        for c in range(2):
            for d in range(2):
                value = 0.5 + 0.1 * s / 4 + (0 if global_model else 0.2 * (c == d)) + 0.01 * d
                rec.add("metrics", algorithm=algorithm, step=s, time_s=0.0, scope="cluster", entity=c, eval_dist=d,
                        metric=metric, value=value, virtual_time=float("nan"))
    for step, client, center, est in weights or []:
        rec.add("weights", step=step, client=client, center=center, estimate=est)
    for name, rows in (tables or {}).items():
        for row in rows:
            rec.add(name, **row)
    write_tables(path, rec.tables())
    summary = {"metric": metric, "kind": "rounds", "algorithm": algorithm, "rounds": 4, "local_mean": {},
               "distributions": [{"distribution": d, "best_center": d, metric: 0.8} for d in range(2)],
               "matching": {"0": 0, "1": 1}}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def _lines(ax):
    return {line.get_gid(): (np.asarray(line.get_xdata()), np.asarray(line.get_ydata())) for line in ax.get_lines()}


def _clustering_rows():
    rows = []
    for s in STEPS:
        rows += [{"step": s, "clustering": "assignment", "metric": "ari", "value": s / 4},
                 {"step": s, "clustering": "assignment", "metric": "nmi", "value": 0.1 + s / 5},
                 {"step": s, "clustering": "assignment", "metric": "changed", "value": float(4 - s)}]
    return rows


def _client_rows(offset=0.0):
    """Every client at every evaluation: value = 0.5 + 0.1 * client + 0.01 * step + offset; one
    held-out client (4) at the last evaluation only."""
    rows = [{"step": s, "client": k, "held_out": False, "metric": "accuracy",
             "value": 0.5 + 0.1 * k + 0.01 * s + offset} for s in STEPS for k in range(CLIENTS)]
    rows += [{"step": s, "client": k, "held_out": False, "metric": "loss", "value": 1.0} for s in STEPS
             for k in range(CLIENTS)]  # another metric: not the headline one
    rows.append({"step": 4, "client": 4, "held_out": True, "metric": "accuracy", "value": 0.3})
    return rows


def _comm_rows(per_client_down=100, per_client_up=50):
    """Rounds 1..4 (a round's rows at its number counted from 1, the step of the evaluation after
    it), every client receiving and sending."""
    return [{"step": t, "client": k, "direction": direction, "bytes": size}
            for t in range(1, 5) for k in range(CLIENTS)
            for direction, size in (("down", per_client_down), ("up", per_client_up))]


# ----------------------------------------------------------------------------- what a run has
def test_the_report_reads_what_a_run_has_from_its_tables(tmp_path):
    one_hot = [(s, k, c, float(c == k % 2)) for s in (0, 2) for k in range(CLIENTS) for c in range(2)]
    soft = [(0, k, c, 0.7 if c == k % 2 else 0.3) for k in range(CLIENTS) for c in range(2)]
    hard = rp.load_run(_run_dir(tmp_path / "hard", weights=one_hot))
    assert (hard.shape.models, hard.shape.clustering, hard.shape.changes) == ("clusters", "hard", ())
    assert hard.matching == {0: 0, 1: 1}
    fuzzy = rp.load_run(_run_dir(tmp_path / "soft", "fedsoft", weights=soft))
    assert (fuzzy.shape.models, fuzzy.shape.clustering) == ("clusters", "soft")
    one = rp.load_run(_run_dir(tmp_path / "global", "plugin:Global", global_model=True))
    assert (one.shape.models, one.shape.clustering, one.matching) == ("global", "none", None)
    md = rp.run_markdown(one, {}, {})
    assert "best center" not in md and "the global model's accuracy" in md and "matched" not in md
    # the membership figure: shares of each group's clients, carried to the run's last round
    fig = rp.plot_weights_by_group(hard)
    assert fig.axes[0].get_ylabel() == "share of the group's clients"
    for ax in fig.axes:
        for x, _ in _lines(ax).values():
            assert x[-1] == 4


def test_a_run_without_the_newer_tables_draws_none_of_their_figures(tmp_path):
    run = rp.load_run(_run_dir(tmp_path / "plain"))
    for plot in (rp.plot_clustering, rp.plot_client_metrics, rp.plot_metric_vs_bytes, rp.plot_staleness):
        assert plot(run) is None
    written = [p.name for p in rp.report_run(run)]
    assert written == ["center_metric.png", "report.md"]
    text = (run.path / "report.md").read_text()
    assert "clustering.png" not in text and "staleness" not in text


# ----------------------------------------------------------------------------- one run
def test_clustering_figure_is_clustering_parquet(tmp_path):
    rows = _clustering_rows() + [{"step": s, "clustering": "weights_argmax", "metric": "ari", "value": 0.5}
                                 for s in STEPS]
    run = rp.load_run(_run_dir(tmp_path / "r", tables={"clustering": rows}))
    fig = rp.plot_clustering(run)
    assert [ax.get_title() for ax in fig.axes] == ["ARI", "NMI", "clients that moved"]
    ari, nmi, moved = (_lines(ax) for ax in fig.axes)
    np.testing.assert_allclose(ari["assignment"][1], [0, 0.5, 1])
    np.testing.assert_allclose(ari["weights_argmax"][1], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(nmi["assignment"][1], [0.1, 0.5, 0.9])
    np.testing.assert_array_equal(moved["assignment"][0], STEPS)
    np.testing.assert_allclose(moved["assignment"][1], [4, 2, 0])
    assert titles_fit(fig)
    assert "clustering.png" in [p.name for p in rp.report_run(run)]


def test_client_metrics_figure_is_the_clients_distribution(tmp_path):
    run = rp.load_run(_run_dir(tmp_path / "r", tables={"client_metrics": _client_rows()}))
    over, cdf = rp.plot_client_metrics(run).axes
    lines = _lines(over)
    for s_i, s in enumerate(STEPS):
        values = 0.5 + 0.1 * np.arange(CLIENTS) + 0.01 * s  # the trained clients only
        assert lines["mean"][1][s_i] == pytest.approx(values.mean())
        assert lines["median"][1][s_i] == pytest.approx(np.median(values))
    band = over.collections[0]
    assert band.get_gid() == "p10-p90"
    ends = _lines(cdf)
    final = 0.5 + 0.1 * np.arange(CLIENTS) + 0.04  # the step line starts at 0 below the lowest
    np.testing.assert_allclose(ends["trained"][0], np.r_[final[0], final])
    np.testing.assert_allclose(ends["trained"][1], [0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(ends["held-out"][0], [0.3, 0.3])
    np.testing.assert_allclose(ends["held-out"][1], [0, 1])
    p = rp.analysis.client_percentiles(run)
    assert p.p10.iloc[0] == pytest.approx(np.quantile(0.5 + 0.1 * np.arange(CLIENTS), 0.1))


def test_metric_against_cumulative_bytes(tmp_path):
    run = rp.load_run(_run_dir(tmp_path / "r", tables={"client_metrics": _client_rows(), "comm": _comm_rows()}))
    fig = rp.plot_metric_vs_bytes(run)
    metric, sent = fig.axes
    x, y = _lines(metric)["metric"]
    # the evaluation at step s follows rounds 1..s: 4 clients x 150 bytes a round
    np.testing.assert_array_equal(x, [0, 2 * 600, 4 * 600])
    np.testing.assert_allclose(y, [0.5 + 0.15 + 0.01 * s for s in STEPS])
    lines = _lines(sent)
    np.testing.assert_array_equal(lines["down"][1], [400, 800, 1200, 1600])
    np.testing.assert_array_equal(lines["up"][1], [200, 400, 600, 800])
    assert titles_fit(fig)


# ----------------------------------------------------------------------------- several runs
@pytest.mark.slow  # draws three runs' figures and four comparison figures
def test_comparison_figures_over_the_newer_tables(tmp_path):
    a = _run_dir(tmp_path / "a", "ifca", tables={"client_metrics": _client_rows(), "comm": _comm_rows(),
                                                 "clustering": _clustering_rows()})
    b = _run_dir(tmp_path / "b", "fedavg", global_model=True,
                 tables={"client_metrics": _client_rows(-0.2), "comm": _comm_rows(50, 50)})
    c = _run_dir(tmp_path / "c", "local")  # none of the newer tables
    out = tmp_path / "cmp"
    files = [p.name for p in rp.report([a, b, c], out=out)]
    assert files[-5:] == ["comparison_center_metric.png", "comparison_client_cdf.png", "comparison_clustering.png",
                          "comparison_metric_vs_bytes.png", "comparison_report.md"]
    runs = [rp.load_run(p) for p in (a, b, c)]
    (ax,) = rp.plot_client_cdf_comparison(runs).axes
    lines = _lines(ax)
    assert sorted(lines) == ["a", "a/held-out", "b", "b/held-out"]
    np.testing.assert_allclose(lines["b"][0][1:], 0.3 + 0.1 * np.arange(CLIENTS) + 0.04)
    ari, nmi = rp.plot_clustering_comparison(runs).axes
    assert sorted(_lines(ari)) == ["a"] and sorted(_lines(nmi)) == ["a"]
    (ax,) = rp.plot_metric_vs_bytes_comparison(runs).axes
    lines = _lines(ax)
    np.testing.assert_array_equal(lines["a"][0], [0, 1200, 2400])
    np.testing.assert_array_equal(lines["b"][0], [0, 800, 1600])
    text = (out / "comparison_report.md").read_text()
    for f in ("comparison_client_cdf.png", "comparison_clustering.png", "comparison_metric_vs_bytes.png"):
        assert f"]({f})" in text
    row_b = next(line for line in text.splitlines() if line.startswith("| [b]") or line.startswith("| b |"))
    assert "(global)" in row_b
    assert not (out / "comparison_kl.png").exists()
