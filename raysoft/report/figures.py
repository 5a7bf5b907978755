"""The figures, drawn with matplotlib's object-oriented API on an Agg canvas (never ``pyplot``).

Every ``plot_*`` function returns its :class:`~matplotlib.figure.Figure` (or ``None`` when the
run has nothing to draw), so its data can be read back from the axes; :func:`save_figure`
writes one as PNG.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

from ..results import atomic_path
from . import analysis as an
from .load import RunData

_PANEL = (4.6, 3.4)  # inches per subplot
_DPI = 100

FIGURE_FILES = {
    "center_metric": "center_metric.png",
    "weights_by_group": "weights_by_group.png",
    "final_weights": "final_weights.png",
    "clusters": "clusters.png",
    "ccfl_accuracy": "ccfl_accuracy.png",
    "staleness": "staleness.png",
    "clustering": "clustering.png",
    "client_metrics": "client_metrics.png",
    "metric_vs_bytes": "metric_vs_bytes.png",
}
COMPARISON_FILES = {
    "center_metric": "comparison_center_metric.png",
    "kl": "comparison_kl.png",
    "client_cdf": "comparison_client_cdf.png",
    "clustering": "comparison_clustering.png",
    "metric_vs_bytes": "comparison_metric_vs_bytes.png",
}


def _figure(panels: int, max_cols: int = 4) -> tuple[Figure, list]:
    cols = max(1, min(panels, max_cols))
    rows = max(1, math.ceil(panels / cols))
    fig = Figure(figsize=(_PANEL[0] * cols, _PANEL[1] * rows), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(panels)]
    return fig, axes


def save_figure(fig: Figure, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=_DPI)
    return path


def _title(run: RunData, what: str) -> str:
    """Two lines: the algorithm and what the figure shows, then the run directory's name."""
    return f"{run.algorithm}: {what}\n{run.name}"


def tick_spacing(steps: Sequence[int] | np.ndarray, most: int = 10) -> int | None:
    """The x-ticks' spacing for measurements at ``steps``: a multiple of their own spacing (the
    evaluation interval: ticks at 0, 10, ..., 50 for evaluations every 5 rounds, never 0, 6, ...,
    48), that multiple 1, 2 or 5 times a power of ten, the smallest with at most ``most`` + 1
    ticks; None for fewer than two distinct steps."""
    s = sorted({int(x) for x in steps})
    if len(s) < 2:
        return None
    every = math.gcd(*[b - a for a, b in zip(s, s[1:])])
    need = math.ceil((s[-1] - s[0]) / every / most)
    k = next(m * 10**p for p in range(12) for m in (1, 2, 5) if m * 10**p >= need)
    return every * k


def _rounds_axis(ax, stream: bool = False, steps: Sequence[int] | np.ndarray | None = None) -> None:
    ax.set_xlabel("global epoch t (uploads)" if stream else "round")
    spacing = None if steps is None else tick_spacing(steps)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True) if spacing is None else MultipleLocator(spacing))


def _fit_titles(fig: Figure) -> Figure:
    """Wrap every title (the figure's and each panel's) that would stick out of the figure, so no
    title is cut; returns ``fig``."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    for _ in range(4):
        fig.draw_without_rendering()  # lays the figure out
        width = fig.bbox.width
        texts = [*fig.texts, *(ax.title for ax in fig.axes)]
        over = [t for t in texts if t.get_text() and (t.get_window_extent(renderer).x0 < 0
                                                       or t.get_window_extent(renderer).x1 > width)]
        if not over:
            break
        for t in over:
            ext = t.get_window_extent(renderer)
            room = 2 * min((ext.x0 + ext.x1) / 2, width - (ext.x0 + ext.x1) / 2)  # centered on its axes
            lines = t.get_text().split("\n")
            chars = max(10, int(max(len(line) for line in lines) * 0.95 * room / max(ext.width, 1.0)))
            t.set_text("\n".join(w for line in lines for w in textwrap.wrap(line, chars) or [""]))
    return fig


def titles_fit(fig: Figure) -> bool:
    """Whether every title of ``fig`` lies inside the figure (as drawn)."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    return all(0 <= t.get_window_extent(renderer).x0 and t.get_window_extent(renderer).x1 <= fig.bbox.width
               for t in [*fig.texts, *(ax.title for ax in fig.axes)] if t.get_text())


def _segments(steps: np.ndarray, values: np.ndarray, breaks: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The pieces of a line cut before each step of ``breaks``."""
    cuts = [int(np.searchsorted(steps, b)) for b in breaks]
    cuts = [0, *[c for c in cuts if 0 < c < len(steps)], len(steps)]
    return [(steps[a:b], values[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]


def plot_center_metric(run: RunData) -> Figure | None:
    """Figure 1 (top): every center's headline metric on every holdout distribution over rounds.
    One panel per distribution, one line per center (``gid`` ``center-<c>``). Where the number of
    clusters changes (:attr:`Shape.changes`: CFL's splits, FPFC's merges) a center's line breaks
    unless its clients stayed the same (pieces ``center-<c>.<i>``), and a dotted vertical line
    (``change-<step>``) marks the evaluation. A run whose centers are one model (FedAvg, a
    stream plug-in with one global model) gets :func:`plot_global_metric` instead. ``None`` when
    the run has no centers (Local)."""
    scores = run.center_scores()
    if scores.empty:
        return None
    if run.shape.global_model:
        return plot_global_metric(run)
    dists = sorted(int(d) for d in scores.eval_dist.unique())
    fig, axes = _figure(len(dists))
    matching = run.matching or {}
    breaks = an.center_breaks(run)
    for ax, d in zip(axes, dists):
        sub = scores[scores.eval_dist == d]
        for c in sorted(int(c) for c in sub.entity.unique()):
            series = sub[sub.entity == c].sort_values("step")
            pieces = _segments(series.step.to_numpy(), series.value.to_numpy(), breaks.get(c, []))
            color = f"C{c % 10}"
            for i, (x, y) in enumerate(pieces):
                final = i == len(pieces) - 1
                matched = c == matching.get(d) and final
                style = "-" if matched or not matching else "--"
                label = f"center {c}" + (" (matched)" if c == matching.get(d) else "") if i == 0 else "_nolegend_"
                ax.plot(x, y, style, marker="o", markersize=3, color=color, label=label,
                        gid=f"center-{c}" if len(pieces) == 1 else f"center-{c}.{i}")
        for i, ch in enumerate(run.shape.changes):
            ax.axvline(ch, linestyle=":", color="0.4", linewidth=1, gid=f"change-{ch}",
                       label="number of clusters changed" if i == 0 else "_nolegend_")
        ax.set_title(f"distribution {d}")
        _rounds_axis(ax, run.is_stream, sub.step.to_numpy())
        ax.set_ylabel(f"test {run.metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(_title(run, f"{run.metric} of every center on each distribution's holdout set"), fontsize="medium")
    return _fit_titles(fig)


def plot_global_metric(run: RunData) -> Figure | None:
    """A run with one global model (FedAvg; a stream plug-in that evaluates its one model once
    per cluster): that model's headline metric on every distribution's holdout set over rounds,
    one panel, one line per distribution (``gid`` ``dist-<d>``)."""
    series = an.global_series(run)
    if series.empty:
        return None
    fig, (ax,) = _figure(1)
    fig.set_size_inches(_PANEL[0] + 1.6, _PANEL[1] + 0.4)
    for d in series.columns:
        col = series[d].dropna()
        ax.plot(col.index.to_numpy(), col.to_numpy(), marker="o", markersize=3, label=f"distribution {int(d)}",
                gid=f"dist-{int(d)}")
    _rounds_axis(ax, run.is_stream, series.index.to_numpy())
    ax.set_ylabel(f"test {run.metric}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", title="holdout set of", title_fontsize="small")
    ax.set_title(_title(run, f"{run.metric} of the global model on each distribution's holdout set"),
                 fontsize="medium")
    return _fit_titles(fig)


def _held_series(mean: pd.Series, last: int) -> tuple[np.ndarray, np.ndarray]:
    """A recorded weight's series held to ``last`` (weights hold until the next record)."""
    x, y = mean.index.to_numpy(), mean.to_numpy()
    if len(x) and x[-1] < last:
        x, y = np.append(x, last), np.append(y, y[-1])
    return x, y


def plot_weights_by_group(run: RunData) -> Figure | None:
    """Figure 1 (bottom): mean importance weight over rounds per true-mixture group. One panel
    per distribution (its matched center; unmatched centers after) or per center; one line per
    group (label and ``gid`` = the group label). Weights are recorded when they change and hold
    until the next record, so in rounds each line is a step line carried to the run's last round
    and every panel's axis spans the run. For a hard clustering (one-hot weights: IFCA, CFL) a
    line is the share of the group's clients in the center. ``None`` when the run records no
    weights, or for a stream whose clients' true mixtures drift (no client has one true mixture
    to group by)."""
    w = run.weights
    if w.empty or (run.is_stream and an.mixture_drifts(run)):
        return None
    hard = run.shape.clustering == "hard"
    groups, order = an.mixture_groups(an.true_shares(run))
    if groups.empty:
        groups = pd.Series("all clients", index=sorted(w.client.unique()))
        order = ["all clients"]
    w = w.assign(group=w.client.map(groups).fillna("unknown"))
    if "unknown" in set(w.group):
        order = [*order, "unknown"]
    mean = w.groupby(["center", "group", "step"]).estimate.mean()
    centers = sorted(int(c) for c in w.center.unique())
    matching = run.matching
    what = "share in" if hard else "weight on"
    panels: list[tuple[str, int]] = []
    if matching:
        panels = [(f"distribution {d}: {what} center {c}", c) for d, c in sorted(matching.items()) if c in centers]
    matched = {c for _, c in panels}
    panels += [(f"{what} center {c}" + (" (unmatched)" if matching else ""), c) for c in centers if c not in matched]
    first = int(min(w.step.min(), run.metrics.step.min() if len(run.metrics) else w.step.min()))
    last = an.last_step(run) if not run.is_stream else int(w.step.max())
    fig, axes = _figure(len(panels))
    for ax, (title, c) in zip(axes, panels):
        for g in order:
            if (c, g) not in mean.index.droplevel("step"):
                continue
            x, y = _held_series(mean.loc[(c, g)].sort_index(), last) if not run.is_stream else (
                mean.loc[(c, g)].sort_index().index.to_numpy(), mean.loc[(c, g)].sort_index().to_numpy())
            ax.plot(x, y, marker="o", markersize=3, label=g, gid=g, drawstyle="default" if run.is_stream
                    else "steps-post")
        ax.set_title(title)
        _rounds_axis(ax, run.is_stream, [first, *mean.index.get_level_values("step").to_numpy(), last])
        ax.set_xlim(first - 0.5, last + 0.5)
        ax.set_ylabel("share of the group's clients" if hard else "mean importance weight")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", title="true mixture", title_fontsize="small")
    what = ("cluster membership of clients with the same true mixture" if hard
            else "importance weights averaged over clients with the same true mixture")
    fig.suptitle(_title(run, what), fontsize="medium")
    return _fit_titles(fig)


def plot_final_weights(run: RunData) -> Figure | None:
    """Figure 2: each client's final weight on the first cluster against its index
    (``collections[0]``), the true share of distribution 0 overlaid (``collections[1]``).
    ``None`` when the run records no weights."""
    final = an.final_weights(run)
    if final.empty:
        return None
    c0 = an.first_center(run, [int(c) for c in final.columns])
    hard = run.shape.clustering == "hard"
    fig, (ax,) = _figure(1)
    fig.set_size_inches(max(_PANEL[0] + 1.0, min(14.0, 0.08 * len(final) + 3)), _PANEL[1] + 0.4)
    label = f"in center {c0} at the end (1) or not (0)" if hard else f"estimated weight on center {c0}"
    ax.scatter(final.index.to_numpy(), final[c0].to_numpy(), s=18, label=label, gid="estimate", zorder=3)
    shares = an.true_shares(run)
    if not shares.empty and 0 in shares.columns:
        ax.scatter(shares.index.to_numpy(), shares[0].to_numpy(), marker="_", s=120, color="tab:red",
                   label="true share of distribution 0", gid="truth", zorder=2)
    matched = run.matching is not None and run.matching.get(0) == c0
    what = f"final {'membership of' if hard else 'weight on'} center {c0}"
    ax.set_title(_title(run, what + (" (matched to distribution 0)" if matched else "")), fontsize="medium")
    ax.set_xlabel("client")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"in center {c0} (final)" if hard else "u_k0 (final)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _fit_titles(fig)


def plot_clusters(run: RunData) -> Figure | None:
    """The hard clustering: predicted cluster against client index, one scatter per true
    cluster (``gid`` ``truth-<t>``); ARI and number of clusters in the title. ``None`` without
    assignments.parquet."""
    a = run.assignments
    if a is None or a.empty:
        return None
    a = a.sort_values("client")
    fig, (ax,) = _figure(1)
    fig.set_size_inches(max(_PANEL[0], min(14.0, 0.08 * len(a) + 3)), _PANEL[1] + 0.4)
    colors = [f"C{i}" for i in range(10)]
    for t in sorted(int(t) for t in a.truth.unique()):
        sub = a[a.truth == t]
        ax.scatter(sub.client.to_numpy(), sub.predicted.to_numpy(), s=24, color=colors[t % 10],
                   label=f"true cluster {t}", gid=f"truth-{t}")
    s = run.summary
    num = s.get("num_clusters", int(a.predicted.nunique()))
    what = f"{num} clusters found ({a.truth.nunique()} true)"
    if s.get("ari") is not None:
        what += f", ARI {s['ari']:.3f}"
    ax.set_title(_title(run, what), fontsize="medium")
    ax.set_xlabel("client")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("predicted cluster")
    ax.set_yticks(sorted(int(p) for p in a.predicted.unique()))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _fit_titles(fig)


def plot_stream_accuracy(run: RunData) -> Figure | None:
    """CCFL's Figure 3: mean Cli Bfr (``gid`` ``cli_bfr``) and Cli Aft (``cli_aft``) over
    the clients at every upload-download cycle, and the cluster models' mean accuracy on their own
    distribution (``cluster``) at cycle = step / clients, all on ``axes[0]``; on its twin
    (``axes[1]``) the number of clients that reached each cycle (``clients``). See
    :func:`stream_accuracy`. ``None`` for runs that are not streams."""
    curves = an.stream_accuracy(run)
    if not curves:
        return None
    fig, (ax,) = _figure(1)
    fig.set_size_inches(_PANEL[0] + 2.4, _PANEL[1] + 0.6)
    count = curves["clients"]
    twin = ax.twinx()
    twin.step(count.index.to_numpy(), count.to_numpy(), where="mid", color="0.6", alpha=0.7, linewidth=1,
              gid="clients", label="clients at this cycle")
    twin.set_ylabel("clients that reached the cycle", color="0.45")
    twin.set_ylim(0, max(1, int(count.max())) * 1.05)
    twin.yaxis.set_major_locator(MaxNLocator(integer=True))
    server = ("Global: the global model, mean over the distributions" if run.shape.global_model
              else "Cluster: cluster models on their own distribution")
    styles = {
        "cli_bfr": ("Cli Bfr: local model before its upload", "tab:blue", "o"),
        "cli_aft": ("Cli Aft: model received from the server", "tab:orange", "s"),
        "cluster": (server, "tab:green", "^"),
    }
    for name, (label, color, marker) in styles.items():
        if name not in curves:
            continue
        series = curves[name]
        ax.plot(series.index.to_numpy(), series.to_numpy(), marker=marker, markersize=3, color=color, label=label,
                gid=name)
    ax.set_zorder(twin.get_zorder() + 1)  # the curves above the count
    ax.patch.set_visible(False)
    ax.set_xlabel("upload-download cycle (" + ("global" if run.shape.global_model else "cluster")
                  + ": step / clients)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    what = "global model" if run.shape.global_model else "cluster"
    ax.set_title(_title(run, f"client and {what} accuracy over upload-download cycles"), fontsize="medium")
    return _fit_titles(fig)


def plot_kl_comparison(runs: Sequence[RunData]) -> Figure | None:
    """CCFL's Figure 4(b): the mean KL(true mixture || estimate) over every upload, one bar
    per run with ``kl`` rows (``patches`` in run order, ``gid`` = the run directory's name; label:
    the algorithm, with the run's name when algorithms repeat). ``None`` when no run has any."""
    kls = [(r, v) for r in runs if (v := an.mean_kl(r)) is not None]
    if not kls:
        return None
    drawn = [r for r, _ in kls]
    fig, (ax,) = _figure(1)
    fig.set_size_inches(max(_PANEL[0], 1.4 * len(kls) + 2), _PANEL[1] + 0.6)
    x = np.arange(len(kls))
    bars = ax.bar(x, [v for _, v in kls], color=[f"C{i % 10}" for i in range(len(kls))], width=0.6)
    for bar, (r, v) in zip(bars, kls):
        bar.set_gid(r.name)
        ax.annotate(f"{v:.3f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom",
                    fontsize="small", xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, [an.run_label(r, drawn) for r in drawn], rotation=15 if len(kls) > 3 else 0, fontsize="small")
    ax.set_ylabel("mean KL(true mixture || estimate)")
    ax.set_ylim(0, max(v for _, v in kls) * 1.15 or 1.0)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title("distribution estimation (CCFL paper, Figure 4(b)):\nmean KL over all uploads, lower is better",
                 fontsize="medium")
    return _fit_titles(fig)


def plot_comparison(runs: Sequence[RunData]) -> Figure | None:
    """Per distribution, the best center's metric over rounds (the best over the centers at each
    evaluation), one line per run (label: the algorithm, with the run directory's name when
    algorithms repeat; ``gid``: the run directory's name). Runs with different headline metrics
    get one row of panels per metric. ``None`` when no run has centers."""
    series = {r.path: an.best_center_series(r) for r in runs}
    drawn = [r for r in runs if not series[r.path].empty]
    metrics = sorted({r.metric for r in drawn})
    panels = [(m, d) for m in metrics
              for d in sorted({int(d) for r in drawn if r.metric == m for d in series[r.path].columns})]
    if not panels:
        return None
    cols = max(sum(1 for m, _ in panels if m == metric) for metric in metrics)
    fig = Figure(figsize=(_PANEL[0] * min(cols, 4), _PANEL[1] * len(metrics) * math.ceil(cols / 4)), dpi=_DPI,
                 layout="constrained")
    FigureCanvasAgg(fig)
    rows = len(metrics) * math.ceil(cols / 4)
    per_row = min(cols, 4)
    for i, metric in enumerate(metrics):
        dists = [d for m, d in panels if m == metric]
        slot = i * math.ceil(cols / 4) * per_row
        for j, d in enumerate(dists):
            ax = fig.add_subplot(rows, per_row, slot + j + 1)
            for r in drawn:
                s = series[r.path]
                if r.metric != metric or d not in s.columns:
                    continue
                col = s[d].dropna()
                ax.plot(col.index.to_numpy(), col.to_numpy(), marker="o", markersize=3, label=an.run_label(r, runs),
                        gid=r.name)
            ax.set_title(f"distribution {d}")
            _rounds_axis(ax, steps=[int(x) for r in drawn if r.metric == metric and d in series[r.path].columns
                                    for x in series[r.path][d].dropna().index])
            if any(r.is_stream for r in drawn):
                ax.set_xlabel("round (streams: global epoch t)" if not all(r.is_stream for r in drawn)
                              else "global epoch t (uploads)")
            ax.set_ylabel(f"best center's test {metric}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    title = "the best center's metric on each distribution's holdout set"
    if any(r.shape.global_model for r in drawn):
        title += " (a run with one global model: that model's)"
    fig.suptitle(title, fontsize="medium")
    return _fit_titles(fig)



# ----------------------------------------------------------------------------- the newer tables
def _byte_unit(most: float) -> tuple[str, int]:
    """The unit to show byte counts up to ``most`` in (B, KiB, MiB, GiB)."""
    return next(((u, size) for u, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if most >= size), ("B", 1))


def _bytes_axis(axis, most: float) -> str:
    """Format ``axis`` (an x or y axis) in the unit of :func:`_byte_unit`; return the unit."""
    unit, size = _byte_unit(most)
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / size:.3g}"))
    return unit


def _ecdf_line(ax, values: np.ndarray, style: str = "-", **kw):
    """The empirical CDF of ``values`` as a step line that starts at 0 (a single value: a vertical step)."""
    x, y = an.ecdf(values)
    return ax.plot(np.r_[x[0], x], np.r_[0.0, y], style, drawstyle="steps-post", **kw)


def plot_staleness(run: RunData) -> Figure | None:
    """A stream's staleness and server versions (:func:`~.analysis.staleness`): on ``axes[0]``
    every upload's staleness t - tau against t (``gid`` ``staleness``) and its running mean over
    as many uploads as there are clients (``staleness-mean``); on ``axes[1]``, against virtual
    time, the server's version t after each upload (``version``) and the version tau the upload
    was trained from (``trained-from``). ``None`` for a run that records no staleness."""
    st = an.staleness(run)
    if st.empty:
        return None
    fig, axes = _figure(2)
    ax = axes[0]
    ax.scatter(st.step.to_numpy(), st.staleness.to_numpy(), s=10, alpha=0.6, gid="staleness",
               label="an upload's staleness t - τ")
    m = run.metrics
    window = max(1, int(m[(m.scope == "client") & (m.metric == "accuracy_before")].entity.nunique()))
    roll = st.staleness.rolling(window, min_periods=1).mean()
    ax.plot(st.step.to_numpy(), roll.to_numpy(), color="tab:red", gid="staleness-mean",
            label=f"mean of the last {window} uploads")
    _rounds_axis(ax, True, st.step.to_numpy())
    ax.set_ylabel("staleness t - τ (server versions)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("staleness of every upload")
    ax = axes[1]
    timed = st.virtual_time.notna().all()
    x = st.virtual_time.to_numpy() if timed else st.step.to_numpy()
    ax.step(x, st.step.to_numpy(), where="post", color="tab:blue", gid="version",
            label="server version t (uploads applied)")
    ax.scatter(x, st.tau.to_numpy(), s=10, color="tab:orange", gid="trained-from",
               label="version τ the upload was trained from")
    ax.set_xlabel("virtual time (s)" if timed else "global epoch t (uploads)")
    ax.set_ylabel("server version")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("server versions")
    fig.suptitle(_title(run, f"staleness and server versions (mean staleness {st.staleness.mean():.2f})"),
                 fontsize="medium")
    return _fit_titles(fig)


def plot_clustering(run: RunData) -> Figure | None:
    """clustering.parquet over the evaluations: one panel per metric (ARI, NMI, mixture error,
    clients that moved, in that order), one line per clustering (``gid`` = the clustering:
    ``assignment``, ``weights_argmax``). ``None`` without the table."""
    series = an.clustering_series(run)
    if not series:
        return None
    fig, axes = _figure(len(series))
    for ax, (metric, by) in zip(axes, series.items()):
        steps: list[int] = []
        for clustering, s in by.items():
            ax.plot(s.index.to_numpy(), s.to_numpy(), marker="o", markersize=3, label=clustering, gid=clustering)
            steps += [int(x) for x in s.index]
        if metric in ("ari", "nmi"):
            ax.set_ylim(min(-0.05, min(float(s.min()) for s in by.values()) - 0.05), 1.05)
        ax.set_title(an.CLUSTERING_METRICS.get(metric, metric))
        ax.set_ylabel(metric)
        _rounds_axis(ax, run.is_stream, steps)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", title="clustering", title_fontsize="small")
    fig.suptitle(_title(run, "its clusterings against the clients' true clusters"), fontsize="medium")
    return _fit_titles(fig)


def plot_client_metrics(run: RunData) -> Figure | None:
    """client_metrics.parquet: on ``axes[0]`` the trained clients' personalised headline metric
    over the evaluations (``mean``, ``median`` and the p10-p90 band ``p10-p90``); on ``axes[1]``
    its CDF over the clients at the last evaluation (``trained``; ``held-out`` for clients kept
    out of training, where the run has them). ``None`` without rows of the headline metric."""
    p = an.client_percentiles(run)
    if p.empty:
        return None
    fig, axes = _figure(2)
    ax = axes[0]
    x = p.index.to_numpy()
    ax.fill_between(x, p.p10.to_numpy(), p.p90.to_numpy(), alpha=0.25, color="tab:blue", gid="p10-p90",
                    label="p10 to p90 of the clients")
    ax.plot(x, p["median"].to_numpy(), color="tab:blue", linestyle="--", gid="median", label="median")
    ax.plot(x, p["mean"].to_numpy(), color="tab:blue", marker="o", markersize=3, gid="mean", label="mean")
    _rounds_axis(ax, run.is_stream, x)
    ax.set_ylabel(f"client's own test {run.metric}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("every client's personalised model")
    ax = axes[1]
    for held, gid, style in ((False, "trained", "-"), (True, "held-out", "--")):
        values = an.final_client_values(run, held)
        if len(values):
            _ecdf_line(ax, values, style, gid=gid, label=f"{'held-out' if held else 'trained'} clients ({len(values)})")
    ax.set_xlabel(f"client's own test {run.metric}")
    ax.set_ylabel("share of clients at or below")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("at the last evaluation (CDF)")
    better = "lower" if run.lower_is_better else "higher"
    fig.suptitle(_title(run, f"per-client {run.metric} ({better} is better)"), fontsize="medium")
    return _fit_titles(fig)


def plot_metric_vs_bytes(run: RunData) -> Figure | None:
    """comm.parquet: the mean personalised metric at every evaluation against the bytes all clients
    sent and received by then (``axes[0]``, ``gid`` ``metric``), and the cumulative bytes down and
    up over the steps (``axes[1]``, ``down`` and ``up``). ``None`` without the table (or without a
    personalised metric: then only the bytes, one panel)."""
    cum = an.cumulative_bytes(run)
    if cum.empty:
        return None
    mv = an.metric_vs_bytes(run)
    fig, axes = _figure(2 if not mv.empty else 1)
    if not mv.empty:
        ax = axes[0]
        ax.plot(mv.bytes.to_numpy(), mv.value.to_numpy(), marker="o", markersize=3, gid="metric")
        unit = _bytes_axis(ax.xaxis, float(mv.bytes.max()))
        ax.set_xlabel(f"bytes sent and received by all clients, cumulative ({unit})")
        ax.set_ylabel(f"mean personalised test {run.metric}")
        ax.grid(alpha=0.3)
        ax.set_title(f"{run.metric} against communication")
    ax = axes[-1]
    for direction in ("down", "up"):
        ax.step(cum.index.to_numpy(), cum[direction].to_numpy(), where="post", gid=direction,
                label=f"{direction} ({_fmt_bytes(float(cum[direction].iloc[-1]))} in all)")
    _rounds_axis(ax, run.is_stream, cum.index.to_numpy())
    unit = _bytes_axis(ax.yaxis, float(cum[["down", "up"]].to_numpy().max()))
    ax.set_ylabel(f"bytes, cumulative ({unit})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("bytes to (down) and from (up) the clients")
    fig.suptitle(_title(run, "communication"), fontsize="medium")
    return _fit_titles(fig)


def _fmt_bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def _per_metric(runs: Sequence[RunData], has) -> list[tuple[str, list[RunData]]]:
    """(headline metric, the runs of that metric for which ``has(run)``), for every metric."""
    drawn = [r for r in runs if has(r)]
    return [(m, [r for r in drawn if r.metric == m]) for m in sorted({r.metric for r in drawn})]


def plot_client_cdf_comparison(runs: Sequence[RunData]) -> Figure | None:
    """Per headline metric, the CDF over the clients of their personalised metric at each run's
    last evaluation (client_metrics.parquet), one line per run (``gid`` the run directory's
    name; ``<name>/held-out`` dashed for its held-out clients). ``None`` when no run has rows."""
    groups = _per_metric(runs, lambda r: len(an.final_client_values(r)) > 0)
    if not groups:
        return None
    fig, axes = _figure(len(groups))
    for ax, (metric, rs) in zip(axes, groups):
        for i, r in enumerate(rs):
            color = f"C{i % 10}"
            _ecdf_line(ax, an.final_client_values(r), color=color, gid=r.name, label=an.run_label(r, runs))
            held = an.final_client_values(r, held_out=True)
            if len(held):
                _ecdf_line(ax, held, "--", color=color, gid=f"{r.name}/held-out",
                           label=f"{an.run_label(r, runs)}, held-out clients")
        better = "lower" if metric == "mse" or metric.endswith("loss") else "higher"
        ax.set_xlabel(f"client's own test {metric} ({better} is better)")
        ax.set_ylabel("share of clients at or below")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("every client's personalised model at the last evaluation (CDF over the clients)",
                 fontsize="medium")
    return _fit_titles(fig)


def plot_clustering_comparison(runs: Sequence[RunData]) -> Figure | None:
    """ARI and NMI (clustering.parquet) over the evaluations, one panel each, one line per run and
    clustering (``gid`` ``<name>`` for a run with one clustering, else ``<name>/<clustering>``).
    ``None`` when no run has the table."""
    series = {r.path: an.clustering_series(r) for r in runs}
    metrics = [m for m in ("ari", "nmi") if any(m in s for s in series.values())]
    if not metrics:
        return None
    fig, axes = _figure(len(metrics))
    for ax, metric in zip(axes, metrics):
        steps: list[int] = []
        for i, r in enumerate(runs):
            by = series[r.path].get(metric, {})
            for j, (clustering, s) in enumerate(by.items()):
                one = len(by) == 1
                ax.plot(s.index.to_numpy(), s.to_numpy(), "-" if j == 0 else "--", marker="o", markersize=3,
                        color=f"C{i % 10}", gid=r.name if one else f"{r.name}/{clustering}",
                        label=an.run_label(r, runs) + ("" if one else f" ({clustering})"))
                steps += [int(x) for x in s.index]
        ax.set_title(an.CLUSTERING_METRICS[metric] + " against the true clusters")
        ax.set_ylabel(metric)
        ax.set_ylim(None, 1.05)
        if steps:
            _rounds_axis(ax, all(r.is_stream for r in runs), steps)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    no = [an.run_label(r, runs) for r in runs if not series[r.path]]
    fig.suptitle("clusters recovered over the evaluations" + (f" (no clustering: {', '.join(no)})" if no else ""),
                 fontsize="medium")
    return _fit_titles(fig)


def plot_metric_vs_bytes_comparison(runs: Sequence[RunData]) -> Figure | None:
    """Per headline metric, each run's mean personalised metric at every evaluation against the
    bytes its clients sent and received by then (comm.parquet), one line per run (``gid`` the
    run directory's name). ``None`` when no run has both."""
    groups = _per_metric(runs, lambda r: not an.metric_vs_bytes(r).empty)
    if not groups:
        return None
    fig, axes = _figure(len(groups))
    for ax, (metric, rs) in zip(axes, groups):
        most = 0.0
        for r in rs:
            mv = an.metric_vs_bytes(r)
            ax.plot(mv.bytes.to_numpy(), mv.value.to_numpy(), marker="o", markersize=3, gid=r.name,
                    label=an.run_label(r, runs))
            most = max(most, float(mv.bytes.max()))
        unit = _bytes_axis(ax.xaxis, most)
        ax.set_xlabel(f"bytes sent and received by all clients, cumulative ({unit})")
        ax.set_ylabel(f"mean personalised test {metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("personalised metric against the bytes spent", fontsize="medium")
    return _fit_titles(fig)
