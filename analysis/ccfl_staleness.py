"""One stream job run under several settings, one Markdown row each: the outcome (Cli Bfr, Cli Aft,
the cluster models) and how stale CCFL's uploads were and how much the staleness factor held
their updates back (from ``estimation.parquet``).

    .venv/bin/python analysis/ccfl_staleness.py [--job jobs/ccfl_fmnist_k4_small.yaml] [--set k=v ...]
        [--variant "LABEL: k=v k=v" ...] [--out runs/ccfl_staleness]

``--set`` applies to every run, ``--variant`` to one (no variant: the job as it is). Without
``--variant`` the defaults are the staleness readings of docs/algorithms.md#ccfl-staleness-clock:
Algorithm 2 as written (every upload an epoch), no staleness factor (``a = 0``), b at one cycle of
every client on the upload clock, the client-cycle clock and the cluster-update clock. E.g. the
small job scaled to the paper's 80 clients (docs/results.md#ccfl-how-stale-is-a-fresh-upload):

    .venv/bin/python analysis/ccfl_staleness.py --set data.clients=80 --set algorithm.cycles=5 \\
        --set algorithm.eval_every=80 --set ray.backend=inprocess

Columns: ``t - tau`` is the median staleness of the fresh uploads (uploads since the client's
download); over the cluster updates the estimate asked for (alpha1 > 0, i.e. alpha > 0 or
rejected), the median ``gap`` on the run's clock, the share with alpha2 = 1 and the median
alpha / alpha0; cluster models at the end and averaged over every evaluation (cluster_acc);
KL over all uploads; wall time.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
from ccfl_pretraining_epochs import own_accuracy  # this folder is first on sys.path when run as a script

import raysoft
from raysoft.config import ConfigError
from raysoft.options import add_overrides

DEFAULT_VARIANTS = [
    "uploads (as written)",
    "a = 0: algorithm.a=0",
    "b = clients: algorithm.b=CLIENTS",
    "client cycles: algorithm.staleness_clock=client_cycles",
    "cluster updates: algorithm.staleness_clock=cluster_updates",
]


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``"LABEL: k=v k=v"`` (or a bare label: no overrides) -> (label, overrides)."""
    label, _, rest = text.partition(":")
    return label.strip(), shlex.split(rest)


def staleness(run_dir: Path, alpha0: float) -> dict[str, float]:
    """Median t - tau of the fresh uploads; over the asked-for cluster updates, the median gap,
    the share with alpha2 = 1 and the median alpha / alpha0 (NaN for a run without a server)."""
    path = run_dir / "estimation.parquet"
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    stale = metrics[(metrics.metric == "staleness")]
    out = {"t_tau": float("nan"), "gap": float("nan"), "full": float("nan"), "ratio": float("nan")}
    if not path.exists():
        return out
    est = pd.read_parquet(path)
    fresh = stale.merge(est[["step"]].drop_duplicates(), left_on="step", right_on="step")
    asked = est[(est.alpha > 0) | est.rejected]
    out.update(t_tau=float(np.median(fresh.value)) if len(fresh) else float("nan"),
               gap=float(np.median(asked.gap)), full=float((asked.alpha2 == 1.0).mean()),
               ratio=float(np.median(asked.alpha / alpha0)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default=str(Path(__file__).parent.parent / "jobs" / "ccfl_fmnist_k4_small.yaml"))
    add_overrides(ap)
    ap.add_argument("--variant", action="append", default=[],
                    help='"LABEL: k=v k=v"; CLIENTS in a value stands for data.clients')
    ap.add_argument("--out", default="runs/ccfl_staleness")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
    try:  # every run's config checked before the first run starts
        base = raysoft.load_config(args.job, ["output.progress=none", *args.overrides])
        cfgs = {label: raysoft.load_config(args.job, ["output.progress=none", *args.overrides,
                                                      *(o.replace("CLIENTS", str(base.data.clients)) for o in extra)])
                for label, extra in variants}
    except ConfigError as err:
        ap.error(str(err))
    print("| variant | Cli Bfr | Cli Aft | clusters at the end | cluster_acc | KL | t − τ | gap | α2 = 1 | α/α0 | s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for label, cfg in cfgs.items():
        run = raysoft.run(cfg, out=args.out)
        m, s = run.metrics, run.summary
        clusters = m[m.scope == "cluster"]
        end = f"{own_accuracy(m, int(clusters.step.max())):.3f}" if len(clusters) else "–"
        st = staleness(run.run_dir, cfg.algorithm.alpha0)

        def f(x: float | None, fmt: str = ".3f") -> str:
            return "–" if x is None or x != x else format(x, fmt)

        print(f"| {label} | {f(s['cli_bfr'])} | {f(s['cli_aft'])} | {end} | {f(s['cluster_acc'])} | "
              f"{f(s['kl'])} | {f(st['t_tau'], '.0f')} | {f(st['gap'], '.2f')} | {f(st['full'], '.0%')} | "
              f"{f(st['ratio'], '.4f')} | {s['wall_time_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
