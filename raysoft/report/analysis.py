"""The numbers behind the figures and tables: true mixtures and their groups, final weights,
the best center's metric over rounds, a stream's upload-download cycles and its mean KL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import yaml

from .load import RunData

MAX_GROUPS = 6  # more distinct true mixtures than this: bin by the share of distribution 0
SHARE_BINS = 5


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


def local_means(run: RunData) -> tuple[float | None, float | None]:
    """The local models' mean as the FedSoft paper scores it (w-bar: ``<metric>_best_learner``
    where the run has it, i.e. FedEM's largest-pi learner, else the headline metric) and, for
    FedEM, its pi-mixture's mean (else ``None``)."""
    local = run.summary.get("local_mean") or {}
    best, mean = local.get(f"{run.metric}_best_learner"), local.get(run.metric)
    return (best, mean) if best is not None else (mean, None)


REGIME_KEYS = {  # algorithm keys that shape a method's local work, shown in its regime
    "prox_weight": "λ", "start": "start", "estimation_interval": "τ", "num_centers": "centers",
}


def regime(run: RunData) -> dict[str, object]:
    """The regime a run trained in (from its config.yaml): optimiser, learning rate, momentum,
    batch size, local epochs, and the algorithm keys of :data:`REGIME_KEYS` it has; empty if the
    run directory has no readable config."""
    try:
        cfg = yaml.safe_load((run.path / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    train, algo = cfg.get("train") or {}, cfg.get("algorithm") or {}
    out = {k: train.get(k) for k in ("optimizer", "lr", "momentum", "batch_size", "local_epochs")}
    out.update({k: algo[k] for k in REGIME_KEYS if k in algo})
    return out


def regime_text(r: Mapping[str, object]) -> str:
    """:func:`regime` in one cell: ``sgd lr 0.05 (momentum 0.9), batch 32 x 1 epoch; λ 0.1, start local``."""
    if not r:
        return "–"
    mom = f" (momentum {r['momentum']:g})" if r.get("optimizer") == "sgd" and r.get("momentum") else ""
    batch = "full batch" if r.get("batch_size") is None else f"batch {r['batch_size']}"
    text = f"{r.get('optimizer')} lr {r.get('lr'):g}{mom}, {batch} × {r.get('local_epochs')} epoch(s)"
    extra = [f"{label} {r[k]}" for k, label in REGIME_KEYS.items() if k in r and k != "num_centers"]
    return text + ("; " + ", ".join(extra) if extra else "")


def run_label(run: RunData, runs: Sequence[RunData]) -> str:
    """The run's algorithm, with its directory's name when another of ``runs`` has the same."""
    same = sum(r.algorithm == run.algorithm for r in runs) > 1
    return f"{run.algorithm} ({run.name})" if same else run.algorithm



# ----------------------------------------------------------------------------- what a run has, over time
def last_step(run: RunData) -> int:
    """The run's last step: its last evaluation, or its rounds (uploads) where the summary says more."""
    steps = [int(run.metrics.step.max())] if len(run.metrics) else [0]
    if isinstance(run.summary.get("rounds"), int):
        steps.append(int(run.summary["rounds"]))
    return max(steps)


def memberships(run: RunData, step: int) -> dict[int, frozenset[int]] | None:
    """Each center's clients in the state evaluated at ``step``, from one-hot weights.parquet rows
    (the latest recorded at or before the round that ended at ``step``; a round t's weights are
    recorded at step t and evaluated at step t + 1); None when the weights say nothing then."""
    w = run.weights
    if w.empty or run.shape.clustering != "hard":
        return None
    upto = w[w.step <= step - (0 if run.is_stream else 1)]
    if upto.empty:
        return None
    last = upto[upto.step == upto.step.max()]
    ones = last[last.estimate == 1.0]
    return {int(c): frozenset(int(k) for k in g.client) for c, g in ones.groupby("center")}


def center_breaks(run: RunData) -> dict[int, list[int]]:
    """Center -> the evaluation steps before which its line breaks: where the number of centers
    changed (a split or a merge) and the center's clients changed too, or are not known."""
    changes = run.shape.changes
    if not changes:
        return {}
    steps = sorted(run.shape.centers)
    out: dict[int, list[int]] = {}
    for ch in changes:
        before = steps[steps.index(ch) - 1]
        then, now = memberships(run, before), memberships(run, ch)
        for c in sorted({int(c) for c in run.center_scores().entity.unique()}):
            same = then is not None and now is not None and c in then and then.get(c) == now.get(c)
            if not same:
                out.setdefault(c, []).append(ch)
    return out


def global_series(run: RunData) -> pd.DataFrame:
    """[step x distribution] the global model's headline metric (a run whose centers are one model)."""
    c = run.center_scores()
    return c.groupby(["step", "eval_dist"]).value.first().unstack("eval_dist").sort_index()


def staleness(run: RunData) -> pd.DataFrame:
    """A stream's uploads with their staleness t - tau: step (= t, the server's version after the
    upload), client (-1 where the run does not say), staleness, tau (the version the upload was
    trained from) and virtual_time (of the upload, where the run records it). From the client
    rows named ``staleness`` (CCFL, FedSoft-Async), else the diagnostics named ``staleness`` (an
    algorithm's own per-upload figure: FedAsync). Empty when the run records neither."""
    m = run.metrics
    rows = m[(m.scope == "client") & (m.metric == "staleness")]
    if not rows.empty:
        out = pd.DataFrame({"step": rows.step.to_numpy(), "client": rows.entity.to_numpy(),
                            "staleness": rows.value.to_numpy()})
    elif run.diagnostics is not None and (run.diagnostics.name == "staleness").any():
        d = run.diagnostics[run.diagnostics.name == "staleness"]
        out = pd.DataFrame({"step": d.step.to_numpy(), "client": -1, "staleness": d.value.to_numpy()})
    else:
        return pd.DataFrame(columns=["step", "client", "staleness", "tau", "virtual_time"])
    out = out.sort_values("step", kind="stable").reset_index(drop=True)
    out["tau"] = out.step - out.staleness
    up = m[(m.scope == "client") & (m.metric == "accuracy_before")]
    vt = up.groupby("step").virtual_time.first() if "virtual_time" in up else pd.Series(dtype=float)
    out["virtual_time"] = out.step.map(vt).astype(float)
    return out


def client_values(run: RunData) -> pd.DataFrame:
    """client_metrics.parquet's rows of the headline metric (step, client, held_out, value);
    empty without the table or the metric."""
    cm = run.client_metrics
    if cm is None or cm.empty:
        return pd.DataFrame(columns=["step", "client", "held_out", "value"])
    rows = cm[cm.metric == run.metric]
    return rows[["step", "client", "held_out", "value"]].reset_index(drop=True)


def client_percentiles(run: RunData) -> pd.DataFrame:
    """[step x (mean, p10, median, p90)] of the trained clients' personalised headline metric."""
    v = client_values(run)
    v = v[~v.held_out.astype(bool)]
    if v.empty:
        return pd.DataFrame(columns=["mean", "p10", "median", "p90"])
    g = v.groupby("step").value
    return pd.DataFrame({"mean": g.mean(), "p10": g.quantile(0.1), "median": g.median(),
                         "p90": g.quantile(0.9)}).sort_index()


def final_client_values(run: RunData, held_out: bool = False) -> np.ndarray:
    """The personalised headline metric of every client (trained, or ``held_out``) at the last
    evaluation that scored them, sorted; empty without rows."""
    v = client_values(run)
    v = v[v.held_out.astype(bool) == held_out]
    if v.empty:
        return np.zeros(0)
    return np.sort(v[v.step == v.step.max()].value.to_numpy())


def ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF's points: the sorted values and the share of values at or below each."""
    x = np.sort(np.asarray(values, dtype=float))
    return x, np.arange(1, len(x) + 1) / max(1, len(x))


def personalised_series(run: RunData) -> pd.Series:
    """The mean personalised headline metric at every evaluation: client_metrics.parquet's
    trained clients where the run has it, else metrics.parquet's client rows of the metric
    (rounds); empty otherwise."""
    p = client_percentiles(run)
    if not p.empty:
        return p["mean"]
    m = run.metrics
    rows = m[(m.scope == "client") & (m.metric == run.metric)]
    return rows.groupby("step").value.mean().sort_index() if not rows.empty else pd.Series(dtype=float)


def cumulative_bytes(run: RunData) -> pd.DataFrame:
    """[step x (down, up, total)]: the bytes every client received and sent by each step of
    comm.parquet, cumulative. Empty without the table."""
    c = run.comm
    if c is None or c.empty:
        return pd.DataFrame(columns=["down", "up", "total"])
    per = c.pivot_table(index="step", columns="direction", values="bytes", aggfunc="sum").sort_index()
    per = per.reindex(columns=["down", "up"], fill_value=0).fillna(0).cumsum()
    per["total"] = per.down + per.up
    return per


def bytes_at(run: RunData, steps: Sequence[int]) -> np.ndarray:
    """The cumulative bytes (down + up) spent by the evaluation at each of ``steps``: comm.parquet's
    rows up to that step (a round's rows are filed under its number counted from 1, the step of
    the evaluation after it; a stream's under the upload's step)."""
    cum = cumulative_bytes(run)
    if cum.empty:
        return np.zeros(len(steps))
    idx = cum.index.to_numpy()
    tot = cum.total.to_numpy()
    out = []
    for s in steps:
        i = np.searchsorted(idx, s, side="right")
        out.append(float(tot[i - 1]) if i else 0.0)
    return np.asarray(out)


def metric_vs_bytes(run: RunData) -> pd.DataFrame:
    """(step, bytes, value): the mean personalised metric at every evaluation against the bytes
    spent by then; empty without comm.parquet or a personalised metric."""
    series = personalised_series(run)
    if run.comm is None or run.comm.empty or series.empty:
        return pd.DataFrame(columns=["step", "bytes", "value"])
    steps = [int(s) for s in series.index]
    return pd.DataFrame({"step": steps, "bytes": bytes_at(run, steps), "value": series.to_numpy()})


CLUSTERING_METRICS = {"ari": "ARI", "nmi": "NMI", "mixture_mae": "mixture error (MAE)", "changed": "clients that moved"}


def clustering_series(run: RunData) -> dict[str, dict[str, pd.Series]]:
    """metric -> clustering -> its values over the evaluations (clustering.parquet); metrics in
    the order of :data:`CLUSTERING_METRICS`, others after. Empty without the table."""
    c = run.clustering
    if c is None or c.empty:
        return {}
    names = [k for k in CLUSTERING_METRICS if k in set(c.metric)] + sorted(set(c.metric) - set(CLUSTERING_METRICS))
    out: dict[str, dict[str, pd.Series]] = {}
    for metric in names:
        sub = c[c.metric == metric]
        out[metric] = {str(k): g.groupby("step").value.mean().sort_index() for k, g in sub.groupby("clustering")}
    return out
