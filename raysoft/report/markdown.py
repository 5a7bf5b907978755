"""The Markdown: one run's report.md, and the comparison of several runs (the one writer of both
``raysoft compare``'s comparison.md and ``raysoft report``'s comparison_report.md)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .analysis import best_center_series, local_means, mean_kl, regime, regime_text, stream_accuracy
from .figures import FIGURE_FILES
from .load import RunData


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


def _share(value: Any) -> str:
    """An accuracy as the CCFL paper's Table 1 prints it (a fraction, three decimals)."""
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def run_markdown(run: RunData, figures: dict[str, Path | None], skipped: dict[str, str]) -> str:
    """The Markdown summary of one run (``figures``: name -> file written; ``skipped``: name ->
    reason): its facts, the stream's accuracy table, the distributions' table, notes, figures."""
    lines = [f"# {run.algorithm}: {run.name}", "", _facts(run), ""] + provenance_lines(run.path)
    if run.is_stream:
        lines += _stream_table(run.summary)
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


def _stream_table(s: dict[str, Any]) -> list[str]:
    """A stream's accuracies (CCFL's Table 1) and mean KL, with the bytes down where recorded."""
    has_bytes = "bytes_down_per_client" in s
    return ["Stream accuracy (CCFL paper, Table 1: Cli Bfr = the local model before its upload, Cli Aft "
            "= the model received for it, both the mean over clients at their final upload-download cycle; "
            "Cluster = the cluster models on their own distribution, averaged over every evaluation) and the "
            "mean KL(true mixture || estimate) over the uploads:", "",
            "| Cli Bfr (`cli_bfr`) | Cli Aft (`cli_aft`) | Cluster (`cluster_acc`) | KL (`kl`) |"
            + (" bytes down per client (`bytes_down_per_client`) |" if has_bytes else ""),
            "|---|---|---|---|" + ("---|" if has_bytes else ""),
            "| " + " | ".join([_fmt("accuracy", s.get("cli_bfr")), _fmt("accuracy", s.get("cli_aft")),
                               _fmt("accuracy", s.get("cluster_acc")), _kl(s.get("kl"))]) + " |"
            + (f" {_bytes(s['bytes_down_per_client'])} |" if has_bytes else ""), ""]


def _distribution_table(run: RunData) -> list[str]:
    """Each distribution's best center and its metric (and matched center), or why there is none."""
    dists = run.summary.get("distributions") or []
    if not dists:
        return ["No centers (nothing to evaluate on the holdout sets).", ""]
    metric, matching = run.metric, run.matching or {}
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
    return lines


def _captions(run: RunData, figures: dict[str, Path | None]) -> dict[str, str]:
    """Each figure's caption, in the order the figures are shown."""
    captions = {
        "center_metric": f"{run.metric} of every center on every distribution's holdout set (FedSoft paper, Figure 1, "
        "top)",
        "weights_by_group": "importance weights averaged over clients with the same true mixture (Figure 1, bottom)",
        "final_weights": "final weight of every client on the first cluster, with its true share (Figure 2)",
        "clusters": "predicted cluster of every client, coloured by its true cluster (FPFC paper, Table 1's Num, ARI)",
        "ccfl_accuracy": "mean client accuracy before (Cli Bfr) and after (Cli Aft) every upload-download cycle and "
        "the cluster models' accuracy on their own distribution (CCFL paper, Figure 3); grey: the "
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


def comparison_markdown(runs: Sequence[RunData], out: Path, figure: Path | None = None,
                        kl_figure: Path | None = None) -> str:
    """The comparison of several runs: ``raysoft compare``'s comparison.md and, with the figures
    ``figure`` (the best center's metric over rounds) and ``kl_figure``, ``raysoft report``'s
    comparison_report.md.

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
        "c*[s]: the metric of the best center on distribution s (that center's index); w̄: the local models' "
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
            cells.append("–" if e is None else f"{_fmt(r.metric, e.get(r.metric))} ({e['best_center']})")
        local, mixture = local_means(r)
        mae = "–" if s.get("weight_mae") is None else f"{s['weight_mae']:.4f}"
        ari = "–" if s.get("ari") is None else f"{s['ari']:.3f} ({s.get('num_clusters', '–')})"
        lines.append(f"| {_run_cell(r, out)} | {r.algorithm} | {r.metric} | " + "".join(f"{c} | " for c in cells)
                     + f"{_fmt(r.metric, local)} | {_fmt(r.metric, mixture)} | {mae} | {ari} | "
                     f"{regime_text(regime(r))} |")
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
        "distribution, averaged over every evaluation; KL: KL(true mixture || estimate) averaged over every "
        "upload (lower is better).", "",
        head, "|---" * (6 + bool(ref) + len(sent)) + "|",
    ]
    for r, kl in zip(streams, kls):
        s = r.summary
        cells = [_share(s.get("cli_bfr")), _share(s.get("cli_aft")), _share(s.get("cluster_acc")), _kl(kl)]
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
