"""The figures, drawn with matplotlib's object-oriented API on an Agg canvas (never ``pyplot``).

Every ``plot_*`` function returns its :class:`~matplotlib.figure.Figure` (or ``None`` when the
run has nothing to draw), so its data can be read back from the axes; :func:`save_figure`
writes one as PNG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, MultipleLocator

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
}
COMPARISON_FILES = {"center_metric": "comparison_center_metric.png", "kl": "comparison_kl.png"}


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


def plot_center_metric(run: RunData) -> Figure | None:
    """Figure 1 (top): every center's headline metric on every holdout distribution over rounds.
    One panel per distribution, one line per center (``gid`` ``center-<c>``); ``None`` when the
    run has no centers (Local)."""
    scores = run.center_scores()
    if scores.empty:
        return None
    dists = sorted(int(d) for d in scores.eval_dist.unique())
    fig, axes = _figure(len(dists))
    matching = run.matching or {}
    for ax, d in zip(axes, dists):
        sub = scores[scores.eval_dist == d]
        for c in sorted(int(c) for c in sub.entity.unique()):
            series = sub[sub.entity == c].sort_values("step")
            style = "-" if c == matching.get(d) else "--" if matching else "-"
            ax.plot(series.step.to_numpy(), series.value.to_numpy(), style, marker="o", markersize=3,
                    label=f"center {c}" + (" (matched)" if c == matching.get(d) else ""), gid=f"center-{c}")
        ax.set_title(f"distribution {d}")
        _rounds_axis(ax, run.is_stream, sub.step.to_numpy())
        ax.set_ylabel(f"test {run.metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(_title(run, f"{run.metric} of every center on each distribution's holdout set"), fontsize="medium")
    return fig


def plot_weights_by_group(run: RunData) -> Figure | None:
    """Figure 1 (bottom): mean importance weight over rounds per true-mixture group. One panel
    per distribution (its matched center; unmatched centers after) or per center; one line per
    group (label and ``gid`` = the group label). ``None`` when the run records no weights, or for
    a stream whose clients' true mixtures drift (no client has one true mixture to group by)."""
    w = run.weights
    if w.empty or (run.is_stream and an.mixture_drifts(run)):
        return None
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
    panels: list[tuple[str, int]] = []
    if matching:
        panels = [(f"distribution {d}: weight on center {c}", c) for d, c in sorted(matching.items()) if c in centers]
    matched = {c for _, c in panels}
    panels += [(f"weight on center {c}" + (" (unmatched)" if matching else ""), c) for c in centers if c not in matched]
    fig, axes = _figure(len(panels))
    for ax, (title, c) in zip(axes, panels):
        for g in order:
            if (c, g) not in mean.index.droplevel("step"):
                continue
            series = mean.loc[(c, g)].sort_index()
            ax.plot(series.index.to_numpy(), series.to_numpy(), marker="o", markersize=3, label=g, gid=g)
        ax.set_title(title)
        _rounds_axis(ax, run.is_stream, mean.index.get_level_values("step").to_numpy())
        ax.set_ylabel("mean importance weight")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", title="true mixture", title_fontsize="small")
    fig.suptitle(_title(run, "importance weights averaged over clients with the same true mixture"), fontsize="medium")
    return fig


def plot_final_weights(run: RunData) -> Figure | None:
    """Figure 2: each client's final weight on the first cluster against its index
    (``collections[0]``), the true share of distribution 0 overlaid (``collections[1]``).
    ``None`` when the run records no weights."""
    final = an.final_weights(run)
    if final.empty:
        return None
    c0 = an.first_center(run, [int(c) for c in final.columns])
    fig, (ax,) = _figure(1)
    fig.set_size_inches(max(_PANEL[0], min(14.0, 0.08 * len(final) + 3)), _PANEL[1] + 0.4)
    ax.scatter(final.index.to_numpy(), final[c0].to_numpy(), s=18, label=f"estimated weight on center {c0}",
               gid="estimate", zorder=3)
    shares = an.true_shares(run)
    if not shares.empty and 0 in shares.columns:
        ax.scatter(shares.index.to_numpy(), shares[0].to_numpy(), marker="_", s=120, color="tab:red",
                   label="true share of distribution 0", gid="truth", zorder=2)
    matched = run.matching is not None and run.matching.get(0) == c0
    ax.set_title(_title(run, f"final weight on center {c0}" + (" (matched to distribution 0)" if matched else "")),
                 fontsize="medium")
    ax.set_xlabel("client")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("u_k0 (final)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


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
    return fig


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
    styles = {
        "cli_bfr": ("Cli Bfr: local model before its upload", "tab:blue", "o"),
        "cli_aft": ("Cli Aft: model received from the server", "tab:orange", "s"),
        "cluster": ("Cluster: cluster models on their own distribution", "tab:green", "^"),
    }
    for name, (label, color, marker) in styles.items():
        if name not in curves:
            continue
        series = curves[name]
        ax.plot(series.index.to_numpy(), series.to_numpy(), marker=marker, markersize=3, color=color, label=label,
                gid=name)
    ax.set_zorder(twin.get_zorder() + 1)  # the curves above the count
    ax.patch.set_visible(False)
    ax.set_xlabel("upload-download cycle (cluster: step / clients)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    ax.set_title(_title(run, "client and cluster accuracy over upload-download cycles"), fontsize="medium")
    return fig


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
    return fig


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
    fig.suptitle("the best center's metric on each distribution's holdout set", fontsize="medium")
    return fig

