"""``raysoft report``'s driver: which files are written where, and the command (its arguments are
parsed by raysoft/cli.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..errors import exit_code
from ..results import atomic_path
from . import figures as fg
from .load import REQUIRED, ReportError, RunData, load_run
from .markdown import comparison_markdown, run_markdown


def _write_text(path: Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return path


PLOTS = {  # figure name -> its plot, in the order report.md shows them
    "center_metric": fg.plot_center_metric,
    "weights_by_group": fg.plot_weights_by_group,
    "final_weights": fg.plot_final_weights,
    "clusters": fg.plot_clusters,
    "ccfl_accuracy": fg.plot_stream_accuracy,
    "staleness": fg.plot_staleness,
    "clustering": fg.plot_clustering,
    "client_metrics": fg.plot_client_metrics,
    "metric_vs_bytes": fg.plot_metric_vs_bytes,
}


def _why_skipped(run: RunData, name: str) -> str | None:
    """Why ``name`` was not drawn for ``run``, where saying so helps; None where the figure is
    simply not one of the run's (a table the run does not write, a stream figure for rounds)."""
    if name == "center_metric":
        return f"no centers were evaluated ({run.algorithm} has none)"
    if name in ("weights_by_group", "final_weights") and run.shape.models == "clusters":
        if run.weights.empty:
            return f"weights.parquet is empty ({run.algorithm} records no importance weights)"
        if name == "weights_by_group":
            return ("the clients' true mixtures drift from cycle to cycle, so no client has one true mixture to "
                    "group by (final_weights.png and the KL show the estimates)")
    if name == "staleness" and run.is_stream and run.shape.models != "none":
        return "the run records no staleness (no client rows or diagnostics named staleness)"
    return None


def report_run(run: RunData) -> list[Path]:
    """Write one run's figures and report.md into its directory; return the files written."""
    written: list[Path] = []
    figures: dict[str, Path | None] = {}
    skipped: dict[str, str] = {}
    for name, plot in PLOTS.items():
        fig = plot(run)
        if fig is None:
            figures[name] = None
            why = _why_skipped(run, name)
            if why is not None:
                skipped[name] = why
            continue
        figures[name] = saved = fg.save_figure(fig, run.path / fg.FIGURE_FILES[name])
        written.append(saved)
    written.append(_write_text(run.path / "report.md", run_markdown(run, figures, skipped)))
    return written


COMPARISON_PLOTS = {  # comparison figure name -> its plot, in the order the comparison shows them
    "center_metric": fg.plot_comparison,
    "client_cdf": fg.plot_client_cdf_comparison,
    "clustering": fg.plot_clustering_comparison,
    "metric_vs_bytes": fg.plot_metric_vs_bytes_comparison,
    "kl": fg.plot_kl_comparison,
}


def comparison_figures(runs: Sequence[RunData], out_dir: Path) -> dict[str, Path]:
    """Draw the figures comparing ``runs`` into ``out_dir`` (``raysoft compare``'s directory, or
    ``raysoft report``'s ``--out``); return name -> file for those drawn. Each is drawn only when
    some run has what it shows (the KL bars: two stream runs or more)."""
    out: dict[str, Path] = {}
    for name, plot in COMPARISON_PLOTS.items():
        if name == "kl" and sum(r.is_stream for r in runs) < 2:
            continue
        fig = plot(runs)
        if fig is not None:
            out[name] = fg.save_figure(fig, out_dir / fg.COMPARISON_FILES[name])
    return out


def report_dir(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """The directory that holds the report: the run directory for one run, ``out`` (default: the
    first run's parent directory; for a ``raysoft compare`` directory, that directory) for several."""
    dirs = _run_dirs(run_dirs)
    if len(dirs) == 1:
        return dirs[0]
    return Path(out) if out is not None else dirs[0].parent


def _run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """The run directories to report on: the paths as given, each ``raysoft compare`` directory
    replaced by the runs inside it, and each directory once."""
    seen, out = set(), []
    for d in (d for p in paths for d in (compare_runs(p) or [Path(p)])):
        key = os.path.realpath(d)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def compare_runs(path: str | Path) -> list[Path]:
    """The run directories inside a ``raysoft compare`` directory (one holding comparison.md and no
    summary.json), in the comparison's order (comparison.parquet's ``run_dir``; any other run
    directory after them, by name). Empty for any other path."""
    p = Path(path)
    if not (p / "comparison.md").is_file() or (p / "summary.json").exists():
        return []
    runs = [d for d in sorted(p.iterdir()) if d.is_dir() and all((d / name).is_file() for name in REQUIRED)]
    try:
        order = list(pd.read_parquet(p / "comparison.parquet", columns=["run_dir"]).run_dir.unique())
    except Exception:  # noqa: BLE001 - no or an unreadable comparison.parquet: the runs by name
        order = []
    return sorted(runs, key=lambda d: order.index(d.name) if d.name in order else len(order))


def report(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> list[Path]:
    """Write the figures and report.md of every run directory and, for several, the comparison's
    figures (:func:`comparison_figures`) and comparison_report.md into ``out`` (default: the first
    run's parent directory).
    Returns the files written. A ``raysoft compare`` directory stands for the runs inside it
    (:func:`compare_runs`), so its comparison_report.md goes beside its comparison.md. Every path
    is checked before anything is written: :class:`ReportError` names the first that is not a
    run directory. ``out`` is used only when there are several runs. A directory given twice is
    reported once."""
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    dirs = _run_dirs(run_dirs)
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
        figures = comparison_figures(runs, out_dir)
        written += figures.values()
        written.append(_write_text(out_dir / "comparison_report.md", comparison_markdown(runs, out_dir, figures)))
    return written


def main(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> int:
    """``raysoft report RUN_DIR [RUN_DIR ...] [--out DIR]`` once raysoft/cli.py has parsed it:
    prints every file written, then (last line) the directory holding the report. Not a run
    directory: one line on stderr, exit 2."""
    try:
        written = report(run_dirs, out=out)
    except ReportError as err:
        sys.stderr.write(f"raysoft report: error: {err}\n")
        return exit_code(err)
    for path in written:
        print(path)
    print(report_dir(run_dirs, out))
    return 0
