"""``raysoft report``: figures and Markdown summaries of finished runs.

    raysoft report RUN_DIR [RUN_DIR ...] [--out DIR]

Into every run directory (PNG, drawn headless with matplotlib's Agg canvas):

* ``center_metric.png`` reproduces papers/fedsoft.md **Figure 1 (top)**: the headline metric
  (test MSE, or accuracy) of every center on every distribution's holdout set over rounds; one
  panel per distribution, one line per center.
* ``weights_by_group.png`` reproduces **Figure 1 (bottom)**: the importance-weight estimates
  over rounds averaged over the clients with the same true mixture (the paper's
  ``u-bar_{a:b}^t``; clients are grouped by their true share vector rounded to 0.1, or, when that
  gives more than 6 groups as the linear and random partitions do, binned into 5 bins by their
  share of distribution 0); one panel per distribution with its matched center (the summary's
  ``matching``; unmatched centers get panels of their own) or, without a matching, one per
  center; one line per group.
* ``final_weights.png`` reproduces **Figure 2**: every client's final weight on the first
  cluster (``u_k0^T``: the center matched to distribution 0, else center 0) against the client
  index, with the client's true share of distribution 0 overlaid.
* ``clusters.png`` (runs with ``assignments.parquet``: IFCA, FPFC) shows the hard clustering
  behind papers/fpfc.md **Table 1**'s Num and ARI columns: each client's predicted cluster,
  coloured by its true cluster, with the ARI and the number of clusters in the title.
* ``ccfl_accuracy.png`` (stream runs: CCFL, FedSoft-Async, Local as a stream) reproduces
  papers/ccfl.md **Figure 3**: over upload-download cycles (a client's k-th upload), the mean over
  clients of Cli Bfr (``accuracy_before``, the local model before its k-th upload) and Cli Aft
  (``accuracy_after``, the model received for that upload), and the mean accuracy of the cluster
  models on their own distribution at cycle = step / clients (the average number of cycles done
  by then; clients = those that uploaded); a grey step line on the right axis counts the clients
  that reached each cycle (fast clients reach more cycles, so the tail averages few clients).
* ``report.md``: algorithm, rounds, the best center of each distribution and its metric, the
  weight MAE, ARI and number of clusters where present, the local models' means, for stream
  runs the summary's Cli Bfr / Cli Aft / Cluster / KL (and bytes downloaded per client), and the
  figures (and why any was skipped: no importance weights, e.g. FedAvg and Local; no centers,
  Local; a stream whose clients' mixtures drift has no groups for Figure 1's bottom).

Given several run directories, also into ``out`` (default: the first run's parent directory):
``comparison_report.md`` (one row per run; with stream runs also their Cli Bfr / Cli Aft / Cluster / KL
table) and ``comparison_center_metric.png`` (per distribution, the best center's metric at every
evaluation, i.e. the best over the centers at that round, one line per run); with at least two
stream runs, ``comparison_kl.png`` reproduces papers/ccfl.md **Figure 4(b)**: the mean KL(true
mixture || estimate) over all uploads, one bar per run that records ``kl``.

Stream runs (a ``summary.json`` ``algorithm`` in :data:`STREAM_ALGORITHMS`, or client rows named
``accuracy_before``) have one upload per step: their x axes say "global epoch t (uploads)", and
cluster model k belongs to distribution k by construction (pre-trained on its public set; the
estimates and the KL compare u_k with share k), so the figures match center k to distribution k
rather than using the summary's accuracy-based matching.

Every plotting function returns its :class:`~matplotlib.figure.Figure` (or ``None`` when the
run has nothing to draw), so its data can be read back from the axes. Figures are built with
matplotlib's object-oriented API on an Agg canvas and never through ``pyplot``, so no display is
needed and the process's matplotlib backend is left alone.

For hard clusterings whose number of centers changes during the run (FPFC), a center index
names a cluster of that round only; the same index at another round need not be the same
cluster.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

REQUIRED = ("summary.json", "metrics.parquet")
MAX_GROUPS = 6  # more distinct true mixtures than this: bin by the share of distribution 0
SHARE_BINS = 5
_LOWER_IS_BETTER = {"mse": True, "loss": True, "accuracy": False}  # as raysoft.evaluation
_PANEL = (4.6, 3.4)  # inches per subplot
_DPI = 100
STREAM_ALGORITHMS = ("ccfl", "fedsoft_async", "local_stream")  # asynchronous streams (raysoft/stream.py)
_WEIGHT_COLUMNS = ["run_id", "step", "client", "center", "estimate"]
_CLIENT_COLUMNS = ["run_id", "step", "client", "distribution", "share", "samples"]

FIGURE_FILES = {
    "center_metric": "center_metric.png",
    "weights_by_group": "weights_by_group.png",
    "final_weights": "final_weights.png",
    "clusters": "clusters.png",
    "ccfl_accuracy": "ccfl_accuracy.png",
}
COMPARISON_FILES = {"center_metric": "comparison_center_metric.png", "kl": "comparison_kl.png"}


class ReportError(ValueError):
    """A path that is not a run directory, or an unusable output directory (one line)."""


# ---------------------------------------------------------------------------- loading
@dataclass(frozen=True)
class RunData:
    """One run directory's summary and tables (optional tables empty / ``None`` when absent)."""

    path: Path
    summary: dict[str, Any]
    metrics: pd.DataFrame
    weights: pd.DataFrame
    clients: pd.DataFrame
    assignments: pd.DataFrame | None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def algorithm(self) -> str:
        algo = self.summary.get("algorithm")
        if algo:
            return str(algo)
        return str(self.metrics.algorithm.iloc[0]) if len(self.metrics) else "?"

    @property
    def metric(self) -> str:
        """The headline metric (``mse`` or ``accuracy``)."""
        metric = self.summary.get("metric")
        if metric:
            return str(metric)
        names = set(self.metrics.metric)
        return "mse" if "mse" in names else "accuracy"

    @property
    def lower_is_better(self) -> bool:
        return lower_is_better(self.metric)

    @property
    def is_stream(self) -> bool:
        """An asynchronous stream run: a stream algorithm, or client rows named ``accuracy_before``."""
        if self.algorithm in STREAM_ALGORITHMS:
            return True
        m = self.metrics
        return bool(((m.scope == "client") & (m.metric == "accuracy_before")).any())

    @property
    def summary_matching(self) -> dict[int, int] | None:
        """Distribution -> center as summary.json has it (by the final scores), if it has one."""
        m = self.summary.get("matching")
        return {int(d): int(c) for d, c in m.items()} if m else None

    @property
    def matching(self) -> dict[int, int] | None:
        """Distribution -> center: the summary's one-to-one matching; for stream runs the
        identity over the cluster models (cluster k is distribution k's by construction)."""
        if self.is_stream:
            c = self.center_scores()
            both = set(c.entity.unique()) & set(c.eval_dist.unique())
            return {int(k): int(k) for k in sorted(both)} or None
        return self.summary_matching

    def center_scores(self) -> pd.DataFrame:
        """The cluster rows of the headline metric (step, entity = center, eval_dist, value)."""
        m = self.metrics
        return m[(m.scope == "cluster") & (m.metric == self.metric)]


def lower_is_better(metric: str) -> bool:
    return _LOWER_IS_BETTER.get(metric, metric.endswith("mse") or metric.endswith("loss"))


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def load_run(path: str | Path) -> RunData:
    """Read a run directory; :class:`ReportError` (naming the path and what is missing) if it is
    not one."""
    p = Path(path)
    if not p.is_dir():
        why = "not a directory" if p.exists() else "no such directory"
        raise ReportError(f"{path}: not a run directory ({why})")
    missing = [name for name in REQUIRED if not (p / name).is_file()]
    if missing:
        raise ReportError(f"{path}: not a run directory (missing {', '.join(missing)})")

    def table(name: str) -> pd.DataFrame | None:
        f = p / f"{name}.parquet"
        if not f.is_file():
            return None
        try:
            return pd.read_parquet(f)
        except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds
            raise ReportError(f"{path}: unreadable {f.name} ({_one_line(err)})") from None

    try:
        summary = json.loads((p / "summary.json").read_text())
    except (OSError, ValueError) as err:
        raise ReportError(f"{path}: unreadable summary.json ({_one_line(err)})") from None
    if not isinstance(summary, dict):
        raise ReportError(f"{path}: unreadable summary.json (not a JSON object)")
    metrics = table("metrics")
    weights = table("weights")
    clients = table("clients")
    return RunData(
        path=p,
        summary=summary,
        metrics=metrics,
        weights=weights if weights is not None else pd.DataFrame(columns=_WEIGHT_COLUMNS),
        clients=clients if clients is not None else pd.DataFrame(columns=_CLIENT_COLUMNS),
        assignments=table("assignments"),
    )


# ---------------------------------------------------------------------------- data helpers
def true_shares(run: RunData) -> pd.DataFrame:
    """[client x distribution] true mixture shares (each client's latest record)."""
    c = run.clients
    if c.empty:
        return pd.DataFrame()
    latest = c[c.step == c.groupby("client").step.transform("max")]
    shares = latest.pivot_table(index="client", columns="distribution", values="share", aggfunc="last")
    return shares.fillna(0.0).sort_index()


def mixture_groups(
    shares: pd.DataFrame, max_groups: int = MAX_GROUPS, bins: int = SHARE_BINS
) -> tuple[pd.Series, list[str]]:
    """Each client's mixture group label (Series indexed by client) and the labels in order.

    Clients are grouped by their share vector rounded to 0.1 and labelled like the paper
    (``10:90``); when that gives more than ``max_groups`` groups they are binned by their share
    of the first distribution into ``bins`` equal bins (``share0 0.0-0.2``, ...)."""
    if shares.empty:
        return pd.Series(dtype=object), []
    rounded = shares.round(1)
    keys = [tuple(row) for row in rounded.to_numpy()]
    if len(set(keys)) <= max_groups:
        labels = pd.Series([":".join(f"{round(100 * v):d}" for v in k) for k in keys], index=shares.index)
        order = [":".join(f"{round(100 * v):d}" for v in k) for k in sorted(set(keys))]
        return labels, order
    s0 = shares.iloc[:, 0].to_numpy()
    idx = np.clip(np.floor(s0 * bins + 1e-9).astype(int), 0, bins - 1)
    names = [f"share0 {b / bins:.1f}-{(b + 1) / bins:.1f}" for b in range(bins)]
    labels = pd.Series([names[i] for i in idx], index=shares.index)
    return labels, [names[b] for b in sorted(set(idx.tolist()))]


def final_weights(run: RunData) -> pd.DataFrame:
    """[client x center] each client's last recorded importance weights."""
    w = run.weights
    if w.empty:
        return pd.DataFrame()
    last = w.sort_values("step", kind="stable").groupby(["client", "center"]).estimate.last()
    return last.unstack("center").sort_index()


def first_center(run: RunData, centers: Sequence[int]) -> int:
    """The center matched to distribution 0, else center 0 (else the lowest center index)."""
    m = run.matching
    if m and 0 in m and m[0] in centers:
        return m[0]
    return 0 if 0 in centers else int(min(centers))


def best_center_series(run: RunData) -> pd.DataFrame:
    """[step x distribution] the best center's headline metric at every evaluation."""
    c = run.center_scores()
    if c.empty:
        return pd.DataFrame()
    agg = "min" if run.lower_is_better else "max"
    return c.pivot_table(index="step", columns="eval_dist", values="value", aggfunc=agg).sort_index()


def mixture_drifts(run: RunData) -> bool:
    """Whether some client's recorded true mixture changes over the steps (stream drift)."""
    c = run.clients
    if c.empty:
        return False
    return bool((c.groupby(["client", "distribution"]).share.nunique() > 1).any())


def upload_cycles(run: RunData) -> pd.DataFrame:
    """One row per upload: client, step, cycle (the client's k-th upload, 1-based, by step) and
    Cli Bfr (``before``). Empty for runs without ``accuracy_before`` rows."""
    m = run.metrics
    b = m[(m.scope == "client") & (m.metric == "accuracy_before")]
    b = b.sort_values(["entity", "step"], kind="stable")
    return pd.DataFrame({
        "client": b.entity.to_numpy(), "step": b.step.to_numpy(),
        "cycle": b.groupby("entity").cumcount().to_numpy() + 1, "before": b.value.to_numpy(),
    })


def stream_accuracy(run: RunData) -> dict[str, pd.Series]:
    """Figure 3's curves, each a Series indexed by cycle: ``cli_bfr`` and ``cli_aft`` (mean over
    the clients that made that cycle's upload; Cli Aft rows are filed under their upload's step),
    ``clients`` (how many clients made a k-th upload) and ``cluster`` (mean accuracy of the
    cluster models on their own distribution, at cycle = step / the number of uploading clients).
    Curves without rows are left out; empty for runs that are not streams."""
    ups = upload_cycles(run)
    if ups.empty:
        return {}
    out = {"cli_bfr": ups.groupby("cycle").before.mean(), "clients": ups.groupby("cycle").client.nunique()}
    m = run.metrics
    after = m[(m.scope == "client") & (m.metric == "accuracy_after")]
    after = after[["entity", "step", "value"]].rename(columns={"entity": "client"})
    after = after.merge(ups[["client", "step", "cycle"]], on=["client", "step"], how="inner")
    if not after.empty:
        out["cli_aft"] = after.groupby("cycle").value.mean()
    own = m[(m.scope == "cluster") & (m.metric == "accuracy") & (m.entity == m.eval_dist)]
    if not own.empty:
        per_step = own.groupby("step").value.mean()
        per_step.index = per_step.index.to_numpy() / ups.client.nunique()
        out["cluster"] = per_step.rename_axis("cycle")
    return out


def mean_kl(run: RunData) -> float | None:
    """The mean of the client rows named ``kl`` (one per upload); ``None`` without any."""
    m = run.metrics
    kl = m[(m.scope == "client") & (m.metric == "kl")].value
    return float(kl.mean()) if len(kl) else None


# ---------------------------------------------------------------------------- figures
def _figure(panels: int, max_cols: int = 4) -> tuple[Figure, list]:
    cols = max(1, min(panels, max_cols))
    rows = max(1, math.ceil(panels / cols))
    fig = Figure(figsize=(_PANEL[0] * cols, _PANEL[1] * rows), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(panels)]
    return fig, axes


def _save(fig: Figure, path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=_DPI)
    os.replace(tmp, path)
    return path


def _title(run: RunData, what: str) -> str:
    """Two lines: the algorithm and what the figure shows, then the run directory's name."""
    return f"{run.algorithm}: {what}\n{run.name}"


def _rounds_axis(ax, stream: bool = False) -> None:
    ax.set_xlabel("global epoch t (uploads)" if stream else "round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


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
        _rounds_axis(ax, run.is_stream)
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
    if w.empty or (run.is_stream and mixture_drifts(run)):
        return None
    groups, order = mixture_groups(true_shares(run))
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
        _rounds_axis(ax, run.is_stream)
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
    final = final_weights(run)
    if final.empty:
        return None
    c0 = first_center(run, [int(c) for c in final.columns])
    fig, (ax,) = _figure(1)
    fig.set_size_inches(max(_PANEL[0], min(14.0, 0.08 * len(final) + 3)), _PANEL[1] + 0.4)
    ax.scatter(final.index.to_numpy(), final[c0].to_numpy(), s=18, label=f"estimated weight on center {c0}",
               gid="estimate", zorder=3)
    shares = true_shares(run)
    if not shares.empty and 0 in shares.columns:
        ax.scatter(shares.index.to_numpy(), shares[0].to_numpy(), marker="_", s=120, color="tab:red",
                   label="true share of distribution 0", gid="truth", zorder=2)
    matched = bool(run.matching) and run.matching.get(0) == c0
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
    """papers/ccfl.md Figure 3: mean Cli Bfr (``gid`` ``cli_bfr``) and Cli Aft (``cli_aft``) over
    the clients at every upload-download cycle, and the cluster models' mean accuracy on their own
    distribution (``cluster``) at cycle = step / clients, all on ``axes[0]``; on its twin
    (``axes[1]``) the number of clients that reached each cycle (``clients``). See
    :func:`stream_accuracy`. ``None`` for runs that are not streams."""
    curves = stream_accuracy(run)
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
    """papers/ccfl.md Figure 4(b): the mean KL(true mixture || estimate) over every upload, one bar
    per run with ``kl`` rows (``patches`` in run order, ``gid`` = the run directory's name; label:
    the algorithm, with the run's name when algorithms repeat). ``None`` when no run has any."""
    kls = [(r, mean_kl(r)) for r in runs]
    kls = [(r, v) for r, v in kls if v is not None]
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
    ax.set_xticks(x, [_label(r, drawn) for r in drawn], rotation=15 if len(kls) > 3 else 0, fontsize="small")
    ax.set_ylabel("mean KL(true mixture || estimate)")
    ax.set_ylim(0, max(v for _, v in kls) * 1.15 or 1.0)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title("distribution estimation (papers/ccfl.md Figure 4(b)):\nmean KL over all uploads, lower is better",
                 fontsize="medium")
    return fig


def _label(run: RunData, runs: Sequence[RunData]) -> str:
    same = sum(r.algorithm == run.algorithm for r in runs) > 1
    return f"{run.algorithm} ({run.name})" if same else run.algorithm


def plot_comparison(runs: Sequence[RunData]) -> Figure | None:
    """Per distribution, the best center's metric over rounds (the best over the centers at each
    evaluation), one line per run (label: the algorithm, with the run directory's name when
    algorithms repeat; ``gid``: the run directory's name). Runs with different headline metrics
    get one row of panels per metric. ``None`` when no run has centers."""
    series = {r.path: best_center_series(r) for r in runs}
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
                ax.plot(col.index.to_numpy(), col.to_numpy(), marker="o", markersize=3, label=_label(r, runs),
                        gid=r.name)
            ax.set_title(f"distribution {d}")
            _rounds_axis(ax)
            if any(r.is_stream for r in drawn):
                ax.set_xlabel("round (streams: global epoch t)" if not all(r.is_stream for r in drawn)
                              else "global epoch t (uploads)")
            ax.set_ylabel(f"best center's test {metric}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    fig.suptitle("the best center's metric on each distribution's holdout set", fontsize="medium")
    return fig


# ---------------------------------------------------------------------------- Markdown
def _fmt(metric: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{100 * value:.1f}%" if "accuracy" in metric else f"{value:.4g}" if abs(value) < 1e-2 else f"{value:.2f}"


def _bytes(value: Any) -> str:
    if value is None:
        return "–"
    if not isinstance(value, (int, float)):
        return str(value)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def _kl(value: Any) -> str:
    return "–" if value is None else f"{value:.4f}"


def _stream_cells(run: RunData) -> list[str]:
    """Cli Bfr, Cli Aft, Cluster (summary.json) and the mean KL (the kl rows, else the summary's)."""
    s = run.summary
    kl = mean_kl(run)
    return [_fmt("accuracy", s.get("cli_bfr")), _fmt("accuracy", s.get("cli_aft")),
            _fmt("accuracy", s.get("cluster_acc")), _kl(kl if kl is not None else s.get("kl"))]


def _local_headline(run: RunData) -> tuple[str, float | None]:
    """The local-model mean that compare.py reports as w-bar: ``<metric>_best_learner`` where it
    exists (FedEM), else the headline metric."""
    local = run.summary.get("local_mean") or {}
    for name in (f"{run.metric}_best_learner", run.metric):
        if local.get(name) is not None:
            return name, float(local[name])
    return run.metric, None


def run_markdown(run: RunData, figures: dict[str, Path | None], skipped: dict[str, str]) -> str:
    """The Markdown summary of one run (``figures``: name -> file written; ``skipped``: name ->
    reason)."""
    s = run.summary
    metric = run.metric
    better = "lower" if run.lower_is_better else "higher"
    lines = [f"# {run.algorithm}: {run.name}", ""]
    facts = [f"algorithm **{run.algorithm}**"]
    if s.get("dataset"):
        facts.append(f"data {s['dataset']}")
    if run.is_stream:
        uploads = s.get("uploads", s.get("rounds"))
        if uploads is not None:
            stale = f" ({s['stale_uploads']} stale)" if s.get("stale_uploads") else ""
            facts.append(f"asynchronous stream of {uploads} uploads{stale}")
    elif s.get("rounds") is not None:
        facts.append(f"{s['rounds']} rounds")
    facts.append(f"headline metric {metric} ({better} is better)")
    lines += [", ".join(facts) + ".", ""]
    if run.is_stream:
        has_bytes = "bytes_down_per_client" in s
        lines += ["Stream accuracy (papers/ccfl.md Table 1: Cli Bfr = the local model before its upload, Cli Aft "
                  "= the model received for it, both the mean over clients at their final upload-download cycle; "
                  "Cluster = the cluster models on their own distribution, averaged over every evaluation) and the "
                  "mean KL(true mixture || estimate) over the uploads:", "",
                  "| Cli Bfr (`cli_bfr`) | Cli Aft (`cli_aft`) | Cluster (`cluster_acc`) | KL (`kl`) |"
                  + (" bytes down per client (`bytes_down_per_client`) |" if has_bytes else ""),
                  "|---|---|---|---|" + ("---|" if has_bytes else ""),
                  "| " + " | ".join([_fmt("accuracy", s.get("cli_bfr")), _fmt("accuracy", s.get("cli_aft")),
                                     _fmt("accuracy", s.get("cluster_acc")), _kl(s.get("kl"))]) + " |"
                  + (f" {_bytes(s['bytes_down_per_client'])} |" if has_bytes else ""), ""]
    dists = s.get("distributions") or []
    matching = run.matching or {}
    if dists:
        lines += ["| distribution | best center | " + f"{metric} |" + (" matched center |" if matching else ""),
                  "|---|---|---|" + ("---|" if matching else "")]
        for d in dists:
            row = f"| {d['distribution']} | {d['best_center']} | {_fmt(metric, d.get(metric))} |"
            if matching:
                row += f" {matching.get(int(d['distribution']), '–')} |"
            lines.append(row)
        lines.append("")
    else:
        lines += ["No centers (nothing to evaluate on the holdout sets).", ""]
    if s.get("weight_mae") is not None:
        lines.append(f"- weight MAE (matched importance weights vs true mixtures): {s['weight_mae']:.4f}")
    if run.is_stream and matching:
        lines.append("- cluster model k belongs to distribution k by construction (pre-trained on its public set; "
                     "the estimates and the KL compare u_k with share k), so the figures match center k to "
                     "distribution k")
        theirs = run.summary_matching
        if theirs and theirs != matching:
            pairs = ", ".join(f"{d}→{c}" for d, c in sorted(theirs.items()))
            lines.append(f"- summary.json's matching by the final accuracies differs ({pairs})"
                         + ("; the weight MAE above uses it" if s.get("weight_mae") is not None else ""))
    if s.get("ari") is not None or s.get("num_clusters") is not None:
        ari = f"{s['ari']:.3f}" if s.get("ari") is not None else "–"
        lines.append(f"- ARI {ari}, {s.get('num_clusters', '–')} clusters")
    local = s.get("local_mean") or {}
    if local:
        lines.append("- local models (mean over clients): " + ", ".join(f"{k} {_fmt(k, v)}" for k, v in local.items()))
    scores = run.center_scores()
    if not scores.empty:
        per_step = scores.groupby("step").entity.nunique()
        if per_step.nunique() > 1:
            lines.append(f"- the number of centers changes over the rounds ({per_step.min()}..{per_step.max()}): "
                         "a center index names a cluster of its round only")
    if lines[-1] != "":
        lines.append("")
    captions = {
        "center_metric": f"{metric} of every center on every distribution's holdout set (papers/fedsoft.md Figure 1, top)",
        "weights_by_group": "importance weights averaged over clients with the same true mixture (Figure 1, bottom)",
        "final_weights": "final weight of every client on the first cluster, with its true share (Figure 2)",
        "clusters": "predicted cluster of every client, coloured by its true cluster (papers/fpfc.md Table 1's Num, ARI)",
        "ccfl_accuracy": "mean client accuracy before (Cli Bfr) and after (Cli Aft) every upload-download cycle and the "
                         "cluster models' accuracy on their own distribution (papers/ccfl.md Figure 3); grey: the "
                         "clients that reached each cycle",
    }
    if figures.get("ccfl_accuracy") is not None:
        curves = stream_accuracy(run)
        missing = [name for key, name in (("cli_aft", "Cli Aft"), ("cluster", "cluster accuracy")) if key not in curves]
        if missing:
            captions["ccfl_accuracy"] += f"; the run records no {' and no '.join(missing)}"
    if run.is_stream:
        captions["final_weights"] = ("each client's estimated weight on cluster 0 at its last upload, with the true "
                                     "share of distribution 0 of that upload (Figure 2)")
    lines += ["## Figures", ""]
    for name, caption in captions.items():
        path = figures.get(name)
        if path is not None:
            lines += [f"**{path.name}**: {caption}", "", f"![{path.name}]({path.name})", ""]
        elif name in skipped:
            lines += [f"- `{FIGURE_FILES[name]}` skipped: {skipped[name]}", ""]
    return "\n".join(lines).rstrip() + "\n"


def comparison_markdown(runs: Sequence[RunData], out: Path, figure: Path | None,
                        kl_figure: Path | None = None) -> str:
    """One row per run: algorithm, best-center metric per distribution, local mean, weight MAE, ARI;
    with stream runs, a second table of their Cli Bfr, Cli Aft, Cluster and mean KL (and the KL
    figure ``kl_figure``)."""
    dists = sorted({int(d["distribution"]) for r in runs for d in (r.summary.get("distributions") or [])})
    metrics = sorted({r.metric for r in runs})
    head = ("| run | algorithm | metric | " + "".join(f"c*[{d}] | " for d in dists)
            + "local mean | weight MAE | ARI (clusters) |")
    lines = [
        "# Comparison", "",
        "c*[s]: the metric of the best center on distribution s (that center's index); local mean: "
        "the local models' mean (FedEM: the largest-π learner's).", "",
        head, "|---" * (6 + len(dists)) + "|",
    ]
    for r in runs:
        s = r.summary
        by_dist = {int(d["distribution"]): d for d in (s.get("distributions") or [])}
        cells = []
        for d in dists:
            e = by_dist.get(d)
            cells.append("–" if e is None else f"{_fmt(r.metric, e.get(r.metric))} ({e['best_center']})")
        _, local = _local_headline(r)
        mae = "–" if s.get("weight_mae") is None else f"{s['weight_mae']:.4f}"
        ari = "–" if s.get("ari") is None else f"{s['ari']:.3f} ({s.get('num_clusters', '–')})"
        link = Path(os.path.relpath(r.path / "report.md", out)).as_posix()
        lines.append(f"| [{r.name}]({link}) | {r.algorithm} | {r.metric} | " + "".join(f"{c} | " for c in cells)
                     + f"{_fmt(r.metric, local)} | {mae} | {ari} |")
    lines.append("")
    if len(metrics) > 1:
        lines += [f"The runs have different headline metrics ({', '.join(metrics)}).", ""]
    if figure is not None:
        lines += [f"![best center's metric per distribution over rounds]({figure.name})", ""]
    no_centers = [r.name for r in runs if best_center_series(r).empty]
    if no_centers:
        lines += [f"No centers, so not in the figure: {', '.join(no_centers)}.", ""]
    streams = [r for r in runs if r.is_stream]
    if streams:
        lines += _stream_comparison(streams, out, kl_figure)
    return "\n".join(lines).rstrip() + "\n"


def _stream_comparison(streams: Sequence[RunData], out: Path, kl_figure: Path | None) -> list[str]:
    """The stream runs' papers/ccfl.md Table 1 triple and mean KL (Figure 4(b)); with exactly one
    FedSoft-Async run that has a KL, every KL also relative to it (the paper sets FedSoft-Async's
    to 1)."""
    refs = [r for r in streams if r.algorithm == "fedsoft_async" and mean_kl(r) is not None]
    ref = mean_kl(refs[0]) if len(refs) == 1 else None
    has_bytes = any("bytes_down_per_client" in r.summary for r in streams)
    head = "| run | method | Cli Bfr | Cli Aft | Cluster | mean KL |"
    head += " KL / fedsoft_async |" if ref else ""
    head += " bytes down per client |" if has_bytes else ""
    cols = 6 + bool(ref) + has_bytes
    lines = [
        "## Streams (papers/ccfl.md Table 1, Figure 4(b))", "",
        "Cli Bfr: the local model before its upload, Cli Aft: the model received for it (both the mean over "
        "clients at their final upload-download cycle); Cluster: the cluster models on their own distribution, "
        "averaged over every evaluation; mean KL: KL(true mixture || estimate) averaged over every upload "
        "(lower is better).", "",
        head, "|---" * cols + "|",
    ]
    for r in streams:
        link = Path(os.path.relpath(r.path / "report.md", out)).as_posix()
        cells = _stream_cells(r)
        kl = mean_kl(r)
        if ref:
            cells.append("–" if kl is None else f"{kl / ref:.3f}")
        if has_bytes:
            cells.append(_bytes(r.summary.get("bytes_down_per_client")))
        lines.append(f"| [{r.name}]({link}) | {_label(r, streams)} | " + " | ".join(cells) + " |")
    lines.append("")
    if kl_figure is not None:
        lines += [f"![mean KL of the distribution estimates per method]({kl_figure.name})", ""]
        no_kl = [r.name for r in streams if mean_kl(r) is None]
        if no_kl:
            lines += [f"No distribution estimates (no kl rows), so not in the KL figure: {', '.join(no_kl)}.", ""]
    return lines


# ---------------------------------------------------------------------------- driver
def _write_text(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def report_run(run: RunData) -> list[Path]:
    """Write one run's figures and report.md into its directory; return the files written."""
    written: list[Path] = []
    figures: dict[str, Path | None] = {}
    skipped: dict[str, str] = {}
    plots = {
        "center_metric": plot_center_metric,
        "weights_by_group": plot_weights_by_group,
        "final_weights": plot_final_weights,
        "clusters": plot_clusters,
        "ccfl_accuracy": plot_stream_accuracy,
    }
    for name, plot in plots.items():
        fig = plot(run)
        if fig is None:
            figures[name] = None
            if name == "center_metric":
                skipped[name] = f"no centers were evaluated ({run.algorithm} has none)"
            elif name in ("weights_by_group", "final_weights") and run.weights.empty:
                skipped[name] = f"weights.parquet is empty ({run.algorithm} records no importance weights)"
            elif name == "weights_by_group":
                skipped[name] = ("the clients' true mixtures drift from cycle to cycle, so no client has one true "
                                 "mixture to group by (final_weights.png and the KL show the estimates)")
            continue
        figures[name] = _save(fig, run.path / FIGURE_FILES[name])
        written.append(figures[name])
    written.append(_write_text(run.path / "report.md", run_markdown(run, figures, skipped)))
    return written


def report_dir(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """The directory that holds the report: the run directory for one run, ``out`` (default: the
    first run's parent directory) for several."""
    dirs = _unique(run_dirs)
    if len(dirs) == 1:
        return dirs[0]
    return Path(out) if out is not None else dirs[0].parent


def _unique(run_dirs: Sequence[str | Path]) -> list[Path]:
    seen, out = set(), []
    for d in run_dirs:
        key = os.path.realpath(d)
        if key not in seen:
            seen.add(key)
            out.append(Path(d))
    return out


def report(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> list[Path]:
    """Write the figures and report.md of every run directory and, for several, comparison_report.md,
    comparison_center_metric.png and (two or more stream runs) comparison_kl.png into ``out``
    (default: the first run's parent directory).
    Returns the files written. Every path is checked before anything is written:
    :class:`ReportError` names the first that is not a run directory. ``out`` is used only when
    there are several runs. A directory given twice is reported once."""
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    dirs = _unique(run_dirs)
    if not dirs:
        raise ReportError("give at least one run directory")
    runs = [load_run(d) for d in dirs]
    out_dir = report_dir(dirs, out)
    if len(runs) > 1:
        if out_dir.exists() and not out_dir.is_dir():
            raise ReportError(f"--out: {out_dir} is not a directory")
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ReportError(f"--out: cannot create {out_dir} ({err.strerror})") from None
    written: list[Path] = []
    for run in runs:
        written += report_run(run)
    if len(runs) > 1:
        fig = plot_comparison(runs)
        figure = _save(fig, out_dir / COMPARISON_FILES["center_metric"]) if fig is not None else None
        if figure is not None:
            written.append(figure)
        kl_figure = None
        if sum(r.is_stream for r in runs) >= 2:
            fig = plot_kl_comparison(runs)
            kl_figure = _save(fig, out_dir / COMPARISON_FILES["kl"]) if fig is not None else None
            if kl_figure is not None:
                written.append(kl_figure)
        written.append(_write_text(out_dir / "comparison_report.md",
                                   comparison_markdown(runs, out_dir, figure, kl_figure)))
    return written


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2
        sys.stderr.write(f"raysoft report: error: {message}\n")
        raise SystemExit(2)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``report`` arguments (for wiring into another parser's subcommand)."""
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (as `raysoft run` prints)")
    parser.add_argument("--out", help="where comparison_report.md goes when several runs are given "
                                      "(default: the first run's parent directory)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    return add_arguments(_Parser(prog="raysoft report", description="Figures and Markdown summaries of finished runs."))


def main(argv: list[str] | None = None) -> int:
    """``raysoft report RUN_DIR [RUN_DIR ...] [--out DIR]``: prints every file written, then (last
    line) the directory holding the report. Not a run directory: one line on stderr, exit 2."""
    args = build_parser().parse_args(argv)
    try:
        written = report(args.run_dirs, out=args.out)
    except ReportError as err:
        sys.stderr.write(f"raysoft report: error: {err}\n")
        return 2
    for path in written:
        print(path)
    print(report_dir(args.run_dirs, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
