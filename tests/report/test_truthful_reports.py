"""raysoft report draws only what an algorithm has, on real small runs: a FedBuff-style stream
plug-in and the FedAsync example (one global model: no centers, no clusters, no matching), the
CFL example (clusters that split: a center's line breaks where its cluster changed; the
membership figure spans the whole run; no title cut), and a stream's staleness and server
versions (CCFL's client rows, FedAsync's diagnostics)."""

from __future__ import annotations

import re
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from support.configs import check_png, stream_config
from support.images import write_fmnist
from support.paths import EXAMPLES

import raysoft
from raysoft import report as rp
from raysoft.report.figures import titles_fit

pytestmark = pytest.mark.slow  # the module's runs take several seconds to make


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    fm = tmp_path_factory.mktemp("fm")
    write_fmnist(fm)
    out = tmp_path_factory.mktemp("runs")
    sys.path.insert(0, str(EXAMPLES / "fedasync"))
    sys.path.insert(0, str(EXAMPLES / "cfl"))
    dirs = {}
    for name, algo in (("buffered", "support.buffered:Buffered"), ("fedasync", "fedasync:FedAsync")):
        cfg = stream_config(fm, name=algo)
        cfg["algorithm"].pop("l_bar")  # a CCFL key
        if name == "buffered":  # a CCFL key too: a plain stream starts from random models (FedAsync declares it)
            cfg["algorithm"].pop("pretrain_epochs")
        dirs[name] = raysoft.run(cfg, out=out).run_dir
    dirs["ccfl"] = raysoft.run(stream_config(fm), out=out).run_dir
    cfl = yaml.safe_load((EXAMPLES / "cfl" / "job.yaml").read_text())
    cfl.update(ray={"backend": "inprocess"}, output={"progress": "none"})
    dirs["cfl"] = raysoft.run(cfl, out=out).run_dir  # 30 rounds; clusters split at rounds 6, 11 and 12
    return dirs


@pytest.fixture(scope="module")
def written(runs):
    return {name: rp.report([d]) for name, d in runs.items()}


def _texts(fig) -> list[str]:
    """Every text of a figure: titles, labels, legend entries, tick labels."""
    fig.canvas.draw()
    out = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    return [t for t in out if t]


def _prose(md: str) -> str:
    """report.md without file names and code spans (a summary key may be named cluster_acc)."""
    return re.sub(r"`[^`]*`|\S+\.png|\]\([^)]*\)", "", md).lower()


@pytest.mark.parametrize("name", ["buffered", "fedasync"])
def test_a_global_model_stream_says_nothing_about_clusters(runs, written, name):
    d = runs[name]
    assert written[name] == [d / f for f in ["center_metric.png", "ccfl_accuracy.png", "staleness.png",
                                             "client_metrics.png", "metric_vs_bytes.png", "report.md"]]
    run = rp.load_run(d)
    assert run.shape.models == "global" and run.shape.clustering == "none" and run.matching is None
    md = (d / "report.md").read_text()
    for word in ("cluster", "center", "matched", "by construction", "importance weight"):
        assert word not in _prose(md), word
    for plot in (rp.plot_center_metric, rp.plot_stream_accuracy, rp.plot_staleness):
        fig = plot(run)
        assert not [t for t in _texts(fig) if "cluster" in t.lower() or "center" in t.lower()], plot.__name__
        assert titles_fit(fig)
    # one line per distribution: the global model's metric, equal to every one of its repeated rows
    (ax,) = rp.plot_center_metric(run).axes
    m = run.metrics
    c = m[(m.scope == "cluster") & (m.metric == "accuracy")]
    assert c.entity.nunique() == 3 and (c.groupby(["step", "eval_dist"]).value.nunique() == 1).all()
    lines = {line.get_gid(): line for line in ax.get_lines()}
    assert sorted(lines) == ["dist-0", "dist-1", "dist-2"]
    for d_ in range(3):
        expect = c[(c.eval_dist == d_) & (c.entity == 0)].sort_values("step")
        np.testing.assert_array_equal(lines[f"dist-{d_}"].get_xdata(), expect.step)
        np.testing.assert_array_equal(lines[f"dist-{d_}"].get_ydata(), expect.value)
    assert "| distribution | the global model's accuracy |" in md and "best center" not in md


def test_ccfl_keeps_its_clusters_and_their_matching(runs, written):
    run = rp.load_run(runs["ccfl"])
    assert run.shape.models == "clusters" and run.shape.by_construction and run.matching == {0: 0, 1: 1, 2: 2}
    assert "cluster model k belongs to distribution k by construction" in (runs["ccfl"] / "report.md").read_text()
    assert {line.get_gid() for line in rp.plot_center_metric(run).axes[0].get_lines()} == {
        "center-0", "center-1", "center-2"}


@pytest.mark.parametrize("name", ["ccfl", "fedasync", "buffered"])
def test_staleness_and_server_versions_are_the_recorded_ones(runs, written, name):
    run = rp.load_run(runs[name])
    m = run.metrics
    rows = m[(m.scope == "client") & (m.metric == "staleness")]
    if name == "ccfl":  # client rows, one per upload
        expect = rows.sort_values("step")
        staleness, steps = expect.value.to_numpy(), expect.step.to_numpy()
    else:  # no client rows: the algorithm's own diagnostics
        assert rows.empty
        diag = pd.read_parquet(runs[name] / "diagnostics.parquet")
        diag = diag[diag.name == "staleness"].sort_values("step")
        staleness, steps = diag.value.to_numpy(), diag.step.to_numpy()
    assert len(steps) == 24 and (staleness >= 1).all()
    check_png(runs[name] / "staleness.png")
    left, right = rp.plot_staleness(run).axes
    points = {c.get_gid(): c.get_offsets() for c in left.collections}
    np.testing.assert_array_equal(points["staleness"], np.column_stack([steps, staleness]))
    version = {line.get_gid(): line for line in right.get_lines()}["version"]
    before = m[(m.scope == "client") & (m.metric == "accuracy_before")].sort_values("step")
    np.testing.assert_allclose(version.get_xdata(), before.virtual_time.to_numpy())  # the upload's virtual time
    np.testing.assert_array_equal(version.get_ydata(), steps)  # the server's version after it
    tau = {c.get_gid(): c.get_offsets() for c in right.collections}["trained-from"]
    np.testing.assert_array_equal(tau[:, 1], steps - staleness)


def test_cfl_center_lines_break_where_clusters_split(runs, written):
    run = rp.load_run(runs["cfl"])
    shape = run.shape
    assert shape.models == "clusters" and shape.clustering == "hard"
    assert shape.centers == {0: 1, 5: 1, 10: 2, 15: 4, 20: 4, 25: 4, 30: 4} and shape.changes == (10, 15)
    fig = rp.plot_center_metric(run)
    for ax in fig.axes:
        gids = {line.get_gid() for line in ax.get_lines()}
        # center 0 holds every client up to round 6, half of them after, a quarter after round 12: three pieces
        assert {"center-0.0", "center-0.1", "center-0.2"} <= gids and "center-0" not in gids
        # center 1 is made at round 6 and split at round 11: a piece at evaluation 10, another from 15 on
        assert {"center-1.0", "center-1.1"} <= gids
        xs = {line.get_gid(): list(line.get_xdata()) for line in ax.get_lines()}
        assert xs["center-0.0"] == [0, 5] and xs["center-0.1"] == [10] and xs["center-0.2"] == [15, 20, 25, 30]
        assert xs["center-1.0"] == [10] and xs["center-1.1"] == [15, 20, 25, 30]
        assert xs["center-2"] == xs["center-3"] == [15, 20, 25, 30]
        assert {"change-10", "change-15"} <= gids
    assert "breaks unless its clients stayed the same" in (runs["cfl"] / "report.md").read_text()


def test_cfl_membership_figure_spans_every_round_and_no_title_is_cut(runs, written):
    run = rp.load_run(runs["cfl"])
    w = run.weights
    assert sorted(w.step.unique()) == [0, 6, 11, 12]  # recorded when the clusters change
    fig = rp.plot_weights_by_group(run)
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        assert lo <= 0 and hi >= 30  # the whole run, whatever the panel's first record
        for line in ax.get_lines():
            assert line.get_xdata()[-1] == 30 and line.get_drawstyle() == "steps-post"
    assert "share in center" in fig.axes[0].get_title()
    for name in ("center_metric", "weights_by_group", "final_weights", "clusters"):
        fig = rp.driver.PLOTS[name](run)
        assert titles_fit(fig), name
