"""The Markdown: one run's report.md, and the comparison of several runs (the one writer of both
``raysoft compare``'s comparison.md and ``raysoft report``'s comparison_report.md)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .analysis import best_center_series, local_means, mean_kl, regime, regime_text, stream_accuracy
from .figures import FIGURE_FILES
from .load import RunData


def _fmt(metric: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{100 * value:.1f}%" if "accuracy" in metric else f"{value:.4g}" if abs(value) < 1e-2 else f"{value:.2f}"


def _bytes(value: object) -> str:
    if value is None:
        return "–"
    if not isinstance(value, (int, float)):
        return str(value)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def _kl(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def _share(value: float | None) -> str:
    """An accuracy as the CCFL paper's Table 1 prints it (a fraction, three decimals)."""
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def run_markdown(run: RunData, figures: dict[str, Path | None], skipped: dict[str, str]) -> str:
    """The Markdown summary of one run (``figures``: name -> file written; ``skipped``: name ->
    reason): its facts, the stream's accuracy table, the distributions' table, notes, figures."""
    lines = [f"# {run.algorithm}: {run.name}", "", _facts(run), ""] + provenance_lines(run.path)
    if run.is_stream:
        lines += _stream_table(run)
    lines += _distribution_table(run)
    lines += _notes(run)
    if lines[-1] != "":
        lines.append("")
    lines += _figures_section(_captions(run, figures), figures, skipped)
    return "\n".join(lines).rstrip() + "\n"


def _facts(run: RunData) -> str:
    """The run in one sentence: its algorithm, data, rounds (or uploads) and headline metric."""
    s = run.summary
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
    better = "lower" if run.lower_is_better else "higher"
    facts.append(f"headline metric {run.metric} ({better} is better)")
    return ", ".join(facts) + "."


def provenance_lines(run_dir: Path) -> list[str]:
    """What made the run (its provenance.json, raysoft.provenance): versions, machine, device, and
    each machine that resumed it; nothing for a run from before it was recorded."""
    from ..provenance import read

    p = read(run_dir)
    if p is None:
        return []

    def made(p: dict[str, Any]) -> str:
        commit = f" (commit {str(p['commit'])[:12]})" if p.get("commit") else ""
        gpus = ", ".join(p.get("gpus") or []) or "no GPU"
        return (f"raysoft {p.get('raysoft')}{commit}, Ray {p.get('ray')}, torch {p.get('torch')}, Python "
                f"{p.get('python')}; {p.get('cpus')} × {p.get('cpu')}, {gpus}; clients on {p.get('device_used')} "
                f"(train.device {p.get('device')}, backend {p.get('backend')})")

    lines = [f"Made with {made(p)}."]
    lines += [f"Resumed with {made(r)}." for r in p.get("resumes", [])]
    return lines + [""]


def _stream_table(run: RunData) -> list[str]:
    """A stream's accuracies (CCFL's Table 1) and, where it estimates mixtures, the mean KL, with
    the bytes down where recorded. A stream with one global model has a Global column, not a
    Cluster one; one without a server (Local) neither."""
    s, shape = run.summary, run.shape
    has_bytes = "bytes_down_per_client" in s
    has_kl = s.get("kl") is not None
    server = {"global": ("Global", "the global model on every distribution, averaged over every evaluation"),
              "clusters": ("Cluster", "the cluster models on their own distribution, averaged over every evaluation"),
              }.get(shape.models)
    what = ("Stream accuracy (laid out as the CCFL paper's Table 1: Cli Bfr = the local model before its upload, "
            "Cli Aft = the model received for it, both the mean over clients at their final upload-download cycle"
            + (f"; {server[0]} = {server[1]}" if server else "") + ")"
            + (" and the mean KL(true mixture || estimate) over the uploads" if has_kl else "") + ":")
    head = ["Cli Bfr (`cli_bfr`)", "Cli Aft (`cli_aft`)"]
    head += [] if not server else ["Global"] if shape.global_model else ["Cluster (`cluster_acc`)"]
    cells = [_fmt("accuracy", s.get("cli_bfr")), _fmt("accuracy", s.get("cli_aft"))]
    cells += [_fmt("accuracy", s.get("cluster_acc"))] if server else []
    if has_kl:
        head.append("KL (`kl`)")
        cells.append(_kl(s.get("kl")))
    if has_bytes:
        head.append("bytes down per client (`bytes_down_per_client`)")
        cells.append(_bytes(s["bytes_down_per_client"]))
    return [what, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head), "| " + " | ".join(cells) + " |", ""]


def _distribution_table(run: RunData) -> list[str]:
    """Each distribution's best center and its metric (and matched center), or why there is none."""
    dists = run.summary.get("distributions") or []
    if not dists:
        return ["No centers (nothing to evaluate on the holdout sets).", ""]
    metric, matching = run.metric, run.matching or {}
    if run.shape.global_model:
        return ([f"| distribution | the global model's {metric} |", "|---|---|"]
                + [f"| {d['distribution']} | {_fmt(metric, d.get(metric))} |" for d in dists] + [""])
    lines = ["| distribution | best center | " + f"{metric} |" + (" matched center |" if matching else ""),
             "|---|---|---|" + ("---|" if matching else "")]
    for d in dists:
        row = f"| {d['distribution']} | {d['best_center']} | {_fmt(metric, d.get(metric))} |"
        if matching:
            row += f" {matching.get(int(d['distribution']), '–')} |"
        lines.append(row)
    return lines + [""]


def _notes(run: RunData) -> list[str]:
    """The bullet points under the table: weight MAE, a stream's matching, ARI, the local models,
    a changing number of centers."""
    s, matching, lines = run.summary, run.matching or {}, []
    if s.get("weight_mae") is not None:
        lines.append(f"- weight MAE (matched importance weights vs true mixtures): {s['weight_mae']:.4f}")
    if run.shape.global_model and run.center_scores().entity.nunique() > 1:
        n = run.center_scores().entity.nunique()
        lines.append(f"- one global model: {run.algorithm} has it evaluated {n} times on every distribution's "
                     "holdout set (equal at every evaluation), so the report shows it once")
    if run.shape.by_construction and matching:
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
                         "a center index names a cluster of its round only; in center_metric.png a center's line "
                         "breaks where the clusters changed (a dotted line) unless its clients stayed the same")
    return lines


def _captions(run: RunData, figures: dict[str, Path | None]) -> dict[str, str]:
    """Each figure's caption, in the order the figures are shown."""
    shape = run.shape
    hard = shape.clustering == "hard"
    captions = {
        "center_metric": f"{run.metric} of every center on every distribution's holdout set (FedSoft paper, Figure 1, "
        "top)",
        "weights_by_group": "importance weights averaged over clients with the same true mixture (Figure 1, bottom); "
        "a weight holds from the round it was recorded at until the next record",
        "final_weights": "final weight of every client on the first cluster, with its true share (Figure 2)",
        "clusters": "predicted cluster of every client, coloured by its true cluster (FPFC paper, Table 1's Num, ARI)",
        "ccfl_accuracy": "mean client accuracy before (Cli Bfr) and after (Cli Aft) every upload-download cycle and "
        "the cluster models' accuracy on their own distribution (CCFL paper, Figure 3); grey: the "
        "clients that reached each cycle",
        "staleness": "left: every upload's staleness t − τ (the server versions applied since the one it was "
        "trained from) and its running mean; right: the server's version t after each upload and the version τ "
        "each upload was trained from",
        "clustering": "the run's clusterings scored against the clients' true clusters at every evaluation "
        "(clustering.parquet: ARI, NMI, mixture error, clients that moved)",
        "client_metrics": f"every client's personalised model on its own test split (client_metrics.parquet): the "
        f"mean, median and p10–p90 of {run.metric} over the evaluations, and its CDF over the clients at the last "
        "one",
        "metric_vs_bytes": "the mean personalised metric against the bytes all clients sent and received by each "
        "evaluation, and the cumulative bytes down and up (comm.parquet)",
    }
    if shape.global_model:
        captions["center_metric"] = (f"{run.metric} of the global model on every distribution's holdout set, one line "
                                     "per distribution")
    if shape.changes:
        captions["center_metric"] += ("; the number of clusters changes at the dotted lines, where a center's line "
                                      "breaks unless its clients stayed the same")
    if hard:
        captions["weights_by_group"] = ("share of the clients with the same true mixture in each center (a hard "
                                        "clustering; the layout of FedSoft's Figure 1, bottom); a membership holds "
                                        "from the round it was recorded at until the next record")
        captions["final_weights"] = "whether each client ends in the first cluster, with its true share (Figure 2)"
    if figures.get("ccfl_accuracy") is not None and shape.models != "clusters":
        server = ("and the global model's mean accuracy over the distributions " if shape.global_model else "")
        captions["ccfl_accuracy"] = ("mean client accuracy before (Cli Bfr) and after (Cli Aft) every "
                                     f"upload-download cycle {server}(laid out as the CCFL paper's Figure 3); grey: "
                                     "the clients that reached each cycle")
    if figures.get("ccfl_accuracy") is not None:
        curves = stream_accuracy(run)
        server = "global model accuracy" if shape.global_model else "cluster accuracy"
        missing = [name for key, name in (("cli_aft", "Cli Aft"), ("cluster", server))
                   if key not in curves and (key != "cluster" or shape.models != "none")]
        if missing:
            captions["ccfl_accuracy"] += f"; the run records no {' and no '.join(missing)}"
    if run.is_stream:
        captions["final_weights"] = ("each client's estimated weight on cluster 0 at its last upload, with the true "
                                     "share of distribution 0 of that upload (Figure 2)")
    return captions


def _figures_section(captions: dict[str, str], figures: dict[str, Path | None], skipped: dict[str, str]) -> list[str]:
    """The figures written, each with its caption, and those skipped with the reason."""
    lines = ["## Figures", ""]
    for name, caption in captions.items():
        path = figures.get(name)
        if path is not None:
            lines += [f"**{path.name}**: {caption}", "", f"![{path.name}]({path.name})", ""]
        elif name in skipped:
            lines += [f"- `{FIGURE_FILES[name]}` skipped: {skipped[name]}", ""]
    return lines


COMPARISON_CAPTIONS = {  # the comparison figures other than the KL bars (shown with the streams' table)
    "center_metric": "the best center's metric on each distribution's holdout set over rounds, one line per run (a run "
    "with one global model: that model's)",
    "client_cdf": "every client's personalised model at the last evaluation: the CDF over the clients, one line per "
    "run (dashed: its held-out clients)",
    "clustering": "ARI and NMI of each run's clusterings against the clients' true clusters over the evaluations",
    "metric_vs_bytes": "the mean personalised metric against the bytes all clients sent and received by each "
    "evaluation",
}


def comparison_markdown(runs: Sequence[RunData], out: Path, figures: Mapping[str, Path] | None = None) -> str:
    """The comparison of several runs: ``raysoft compare``'s comparison.md and ``raysoft report``'s
    comparison_report.md, with ``figures`` (name -> file of :data:`~.figures.COMPARISON_FILES`,
    drawn by :func:`~.driver.comparison_figures`) shown under their captions.

    One row per run: its algorithm and headline metric, the metric of the best center on each
    distribution (that center's index: the FedSoft paper's Table 2), the local models' mean w̄
    (FedEM: the largest-pi learner's, and its pi-mixture's in a column of its own), the weight
    MAE, and the ARI and number of clusters. With stream runs, a second table: the CCFL paper's
    Table 1 (Cli Bfr, Cli Aft, Cluster), the mean KL of Figure 4(b) (also relative to
    FedSoft-Async's when exactly one run is FedSoft-Async with a KL) and the bytes per client.
    A run is named by its directory, linked to its report.md (relative to ``out``, the folder
    of the Markdown file) where it has one."""
    dists = sorted({int(d["distribution"]) for r in runs for d in (r.summary.get("distributions") or [])})
    metrics = sorted({r.metric for r in runs})
    head = ("| run | algorithm | metric | " + "".join(f"c*[{d}] | " for d in dists)
            + "w̄ | w̄ (mixture) | weight MAE | ARI (clusters) | regime |")
    lines = [
        "# Comparison", "",
        "c*[s]: the metric of the best center on distribution s (that center's index; global: a run with one "
        "global model); w̄: the local models' "
        "mean (FedEM: the largest-π learner's; w̄ (mixture): its π-mixture's); weight MAE: the matched "
        "importance weights against the true mixtures; ARI: the clusters found against the true ones; regime: "
        "the local work each method ran with (its config's optimiser, batch, epochs and proximal keys).", "",
        head, "|---" * (8 + len(dists)) + "|",
    ]
    for r in runs:
        s = r.summary
        by_dist = {int(d["distribution"]): d for d in (s.get("distributions") or [])}
        cells = []
        for d in dists:
            e = by_dist.get(d)
            which = "global" if r.shape.global_model else e["best_center"] if e is not None else ""
            cells.append("–" if e is None else f"{_fmt(r.metric, e.get(r.metric))} ({which})")
        local, mixture = local_means(r)
        mae = "–" if s.get("weight_mae") is None else f"{s['weight_mae']:.4f}"
        ari = "–" if s.get("ari") is None else f"{s['ari']:.3f} ({s.get('num_clusters', '–')})"
        lines.append(f"| {_run_cell(r, out)} | {r.algorithm} | {r.metric} | " + "".join(f"{c} | " for c in cells)
                     + f"{_fmt(r.metric, local)} | {_fmt(r.metric, mixture)} | {mae} | {ari} | "
                     f"{regime_text(regime(r))} |")
    lines.append("")
    if len(metrics) > 1:
        lines += [f"The runs have different headline metrics ({', '.join(metrics)}).", ""]
    figures = dict(figures or {})
    for name, caption in COMPARISON_CAPTIONS.items():
        if name not in figures:
            continue
        lines += [f"**{figures[name].name}**: {caption}.", "", f"![{caption}]({figures[name].name})", ""]
        no_centers = [r.name for r in runs if best_center_series(r).empty]
        if name == "center_metric" and no_centers:
            lines += [f"No centers, so not in the figure: {', '.join(no_centers)}.", ""]
    streams = [r for r in runs if r.is_stream]
    if streams:
        lines += _stream_comparison(streams, out, figures.get("kl"))
    return "\n".join(lines).rstrip() + "\n"


def _run_cell(run: RunData, out: Path) -> str:
    """The run's directory name, linked to its report.md (relative to ``out``) if it has one."""
    if not (run.path / "report.md").is_file():
        return run.name
    return f"[{run.name}]({Path(os.path.relpath(run.path / 'report.md', out)).as_posix()})"


def _stream_comparison(streams: Sequence[RunData], out: Path, kl_figure: Path | None) -> list[str]:
    """The stream runs' table of :func:`comparison_markdown` (and the KL figure ``kl_figure``)."""
    kls = [mean_kl(r) for r in streams]
    kls = [kl if kl is not None else r.summary.get("kl") for r, kl in zip(streams, kls)]  # no kl rows: the summary's
    refs = [kl for r, kl in zip(streams, kls) if r.algorithm == "fedsoft_async" and kl is not None]
    ref = refs[0] if len(refs) == 1 else None  # the paper's Figure 4(b) sets FedSoft-Async's KL to 1
    sent = [key for key in ("bytes_down_per_client", "bytes_up_per_client") if any(key in r.summary for r in streams)]
    head = "| run | algorithm | Cli Bfr | Cli Aft | Cluster | KL |"
    head += " KL / fedsoft_async |" if ref else ""
    head += "".join(
        {"bytes_down_per_client": " bytes down / client |", "bytes_up_per_client": " bytes up / client |"}[k]
        for k in sent
    )
    lines = [
        "## Streams (the CCFL paper's Table 1 and Figure 4(b))", "",
        "Cli Bfr: the local model before its upload, Cli Aft: the model received for it (both the mean accuracy "
        "over clients at their final upload-download cycle); Cluster: the cluster models on their own "
        "distribution (global: a run's one global model on every distribution), averaged over every evaluation; "
        "KL: KL(true mixture || estimate) averaged over every upload (lower is better).", "",
        head, "|---" * (6 + bool(ref) + len(sent)) + "|",
    ]
    for r, kl in zip(streams, kls):
        s = r.summary
        server = _share(s.get("cluster_acc")) + (" (global)" if r.shape.global_model else "")
        cells = [_share(s.get("cli_bfr")), _share(s.get("cli_aft")), server, _kl(kl)]
        if ref:
            cells.append("–" if kl is None else f"{kl / ref:.3f}")
        cells += [_bytes(s.get(key)) for key in sent]
        lines.append(f"| {_run_cell(r, out)} | {r.algorithm} | " + " | ".join(cells) + " |")
    lines.append("")
    if kl_figure is not None:
        lines += [f"![mean KL of the distribution estimates per method]({kl_figure.name})", ""]
        no_kl = [r.name for r in streams if mean_kl(r) is None]
        if no_kl:
            lines += [f"No distribution estimates (no kl rows), so not in the KL figure: {', '.join(no_kl)}.", ""]
    return lines
