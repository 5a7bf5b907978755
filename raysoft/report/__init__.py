"""``raysoft report``: figures and Markdown summaries of finished runs.

    raysoft report RUN_DIR [RUN_DIR ...] [--out DIR]

Into every run directory (PNG, drawn headless with matplotlib's Agg canvas):

* ``center_metric.png`` reproduces FedSoft's **Figure 1 (top)** (Ruan & Joe-Wong, AAAI 2022):
  the headline metric (test MSE, or accuracy) of every center on every distribution's holdout
  set over rounds; one panel per distribution, one line per center.
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
  behind the Num and ARI columns of FPFC's **Table 1** (Yu et al., AAAI 2023): each client's
  predicted cluster, coloured by its true cluster, with the ARI and the number of clusters in
  the title.
* ``ccfl_accuracy.png`` (stream runs: CCFL, FedSoft-Async, Local as a stream) reproduces
  CCFL's **Figure 3** ("Client-Centric Federated Learning under Dynamic Mixtures of
  Distributions"): over upload-download cycles (a client's k-th upload), the mean over clients
  of Cli Bfr (``accuracy_before``, the local model before its k-th upload) and Cli Aft
  (``accuracy_after``, the model received for that upload), and the mean accuracy of the cluster
  models on their own distribution at cycle = step / clients (the average number of cycles done
  by then; clients = those that uploaded); a grey step line on the right axis counts the clients
  that reached each cycle (fast clients reach more cycles, so the tail averages few clients).
* ``staleness.png`` (streams that record a staleness: client rows or diagnostics named
  ``staleness``): every upload's staleness t - tau against t with its running mean, and the
  server's version t after each upload against virtual time with the version tau it was trained
  from.
* ``clustering.png`` (clustering.parquet): ARI, NMI, mixture error and the clients that moved,
  over the evaluations, one line per clustering.
* ``client_metrics.png`` (client_metrics.parquet): the trained clients' personalised metric
  over the evaluations (mean, median, p10-p90) and its CDF at the last one, held-out clients
  apart.
* ``metric_vs_bytes.png`` (comm.parquet): the mean personalised metric against the cumulative
  bytes, and the bytes down and up over the steps.
* ``report.md``: algorithm, rounds, the best center of each distribution and its metric, the
  weight MAE, ARI and number of clusters where present, the local models' means, for stream
  runs the summary's Cli Bfr / Cli Aft / Cluster / KL (and bytes downloaded per client), and the
  figures (and why any was skipped: no importance weights, e.g. FedAvg and Local; no centers,
  Local; a stream whose clients' mixtures drift has no groups for Figure 1's bottom).

What a run has decides what is drawn and said (:mod:`.shape`, read from the tables alone): one
global model (FedAvg; a stream plug-in whose center rows are one model repeated) is drawn as one
model on every distribution, with no centers, matching or weights; a hard clustering's weights
are drawn as the share of each group in each center; where the number of centers changes (CFL,
FPFC) a center's line breaks unless its clients stayed the same; weights hold until the next
record, so their lines are carried to the run's last round; every title is wrapped to fit.

A ``raysoft compare`` directory (comparison.md and one run directory per algorithm) stands for
the runs inside it. Given several run directories, also into ``out`` (default: the first run's
parent directory, so a comparison's own directory):
``comparison_report.md`` (one row per run; with stream runs also their Cli Bfr / Cli Aft /
Cluster / KL table) and ``comparison_center_metric.png`` (per distribution, the best center's
metric at every evaluation, i.e. the best over the centers at that round, one line per run);
with at least two stream runs, ``comparison_kl.png`` reproduces CCFL's **Figure 4(b)**: the
mean KL(true mixture || estimate) over all uploads, one bar per run that records ``kl``; and,
where some run has the table, ``comparison_client_cdf.png`` (client_metrics.parquet: the CDF
over the clients of each run's personalised metric), ``comparison_clustering.png``
(clustering.parquet: ARI and NMI over the evaluations) and ``comparison_metric_vs_bytes.png``
(comm.parquet: the mean personalised metric against the bytes spent). ``raysoft compare``
draws the same comparison figures beside its comparison.md (:func:`.driver.comparison_figures`).

Stream runs (a ``summary.json`` of ``kind`` stream or naming a stream algorithm, or client rows named
``accuracy_before``) have one upload per step: their x axes say "global epoch t (uploads)". Where
a stream's cluster model k belongs to distribution k by construction (CCFL, FedSoft-Async:
pre-trained on its public set; the estimates and the KL compare u_k with share k; the summary
matches them so), the figures match center k to distribution k; a stream with one global model
has no matching.

Every plotting function returns its :class:`~matplotlib.figure.Figure` (or ``None`` when the
run has nothing to draw), so its data can be read back from the axes. Figures are built with
matplotlib's object-oriented API on an Agg canvas and never through ``pyplot``, so no display is
needed and the process's matplotlib backend is left alone.

For hard clusterings whose number of centers changes during the run (FPFC), a center index
names a cluster of that round only; the same index at another round need not be the same
cluster.

The modules: :mod:`.load` reads a run directory into a :class:`RunData`; :mod:`.analysis`
computes the numbers; :mod:`.figures` draws them; :mod:`.markdown` writes report.md and the
comparison; :mod:`.driver` decides which files go where (:func:`report`) and is the command.
"""

from ..metrics import lower_is_better
from .analysis import (
    MAX_GROUPS,
    SHARE_BINS,
    best_center_series,
    final_weights,
    first_center,
    local_means,
    mean_kl,
    mixture_drifts,
    mixture_groups,
    run_label,
    stream_accuracy,
    true_shares,
    upload_cycles,
)
from .driver import compare_runs, comparison_figures, main, report, report_dir, report_run
from .figures import (
    COMPARISON_FILES,
    FIGURE_FILES,
    plot_center_metric,
    plot_client_cdf_comparison,
    plot_client_metrics,
    plot_clustering,
    plot_clustering_comparison,
    plot_clusters,
    plot_comparison,
    plot_final_weights,
    plot_global_metric,
    plot_kl_comparison,
    plot_metric_vs_bytes,
    plot_metric_vs_bytes_comparison,
    plot_staleness,
    plot_stream_accuracy,
    plot_weights_by_group,
    save_figure,
)
from .load import REQUIRED, ReportError, RunData, load_run
from .markdown import comparison_markdown, run_markdown
from .shape import Shape, describe

__all__ = [
    "COMPARISON_FILES",
    "FIGURE_FILES",
    "MAX_GROUPS",
    "REQUIRED",
    "SHARE_BINS",
    "ReportError",
    "RunData",
    "Shape",
    "best_center_series",
    "compare_runs",
    "comparison_figures",
    "comparison_markdown",
    "describe",
    "final_weights",
    "first_center",
    "load_run",
    "local_means",
    "lower_is_better",
    "main",
    "mean_kl",
    "mixture_drifts",
    "mixture_groups",
    "plot_center_metric",
    "plot_client_cdf_comparison",
    "plot_client_metrics",
    "plot_clustering",
    "plot_clustering_comparison",
    "plot_clusters",
    "plot_comparison",
    "plot_final_weights",
    "plot_global_metric",
    "plot_kl_comparison",
    "plot_metric_vs_bytes",
    "plot_metric_vs_bytes_comparison",
    "plot_staleness",
    "plot_stream_accuracy",
    "plot_weights_by_group",
    "report",
    "report_dir",
    "report_run",
    "run_label",
    "run_markdown",
    "save_figure",
    "stream_accuracy",
    "true_shares",
    "upload_cycles",
]
