"""Callbacks: hooks called with each round's (or upload batch's) new metric rows and at the end of
a run, on the driver (the process that runs ``raysoft run``).

A config's ``callbacks:`` list names them like any plug-in (a built-in name, a registered one, or
an import path ``module:Class``), each with the keys of its own settings::

    callbacks:
      - name: tensorboard          # pip install 'raysoft[tensorboard]'
        logdir: runs/tb
      - name: early_stop:EarlyStop  # a user's callback, from early_stop.py
        metric: mse
        patience: 3

A callback is a class made as ``Callback(settings, run)`` (``run``: a :class:`RunInfo`) with
two methods (the base :class:`Callback` has both, doing nothing):

* ``on_rows(rows) -> bool | None``: ``rows`` is a :class:`pandas.DataFrame` of the
  ``metrics.parquet`` rows recorded since the last call (same columns); returning True stops the
  run after the step just done: it is then written as a complete run whose ``summary.json`` says
  ``stopped_early``;
* ``on_end(summary, run_dir)``: once the run's files are written.

The Parquet files stay the record; loggers are views of it. The built-in loggers are
:class:`TensorBoardLogger` (``tensorboard``) and :class:`MLflowLogger` (``mlflow``); their
packages are optional extras.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pandas as pd
from pydantic import Field

from .config import CallbackConfig, Config
from .errors import one_line
from .plugins import PluginError

if TYPE_CHECKING:
    from .protocols import CallbackHooks


@dataclass(frozen=True)
class RunInfo:
    """What a callback knows of its run: the id, the directory being written (a hidden
    ``.<id>.partial`` one until the run completes, unless it is checkpointed) and the config."""

    run_id: str
    run_dir: Path
    config: Config


class Callback:
    """The base of callbacks: both hooks do nothing."""

    Settings = CallbackConfig

    def __init__(self, settings: CallbackConfig, run: RunInfo) -> None:
        self.settings = settings
        self.run = run

    def on_rows(self, rows: pd.DataFrame) -> bool | None:
        """New metric rows (``metrics.parquet``'s columns); True stops the run early."""
        return None

    def on_end(self, summary: dict[str, Any], run_dir: Path) -> None:
        """The run is written to ``run_dir``; ``summary`` is its ``summary.json``."""


def _scalars(rows: pd.DataFrame) -> list[tuple[str, float, int]]:
    """(tag, value, step) of every row: ``<scope>/<metric>/e<entity>/d<eval_dist>``."""
    return [(f"{r.scope}/{r.metric}/e{r.entity}/d{r.eval_dist}", float(r.value), int(r.step))
            for r in rows.itertuples(index=False)]


class TensorBoardSettings(CallbackConfig):
    logdir: str | None = Field(None, description="the event files' folder; default <run_dir>/tensorboard")


class TensorBoardLogger(Callback):
    """Every metric row as a TensorBoard scalar, tagged ``scope/metric/e<entity>/d<eval_dist>``
    at its step (needs the ``tensorboard`` package: ``pip install 'raysoft[tensorboard]'``)."""

    Settings = TensorBoardSettings
    settings: TensorBoardSettings

    def __init__(self, settings: TensorBoardSettings, run: RunInfo) -> None:
        super().__init__(settings, run)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise PluginError("callback 'tensorboard': needs the tensorboard package "
                              "(pip install 'raysoft[tensorboard]')") from None
        self.logdir = Path(settings.logdir) if settings.logdir else run.run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.logdir / run.run_id))

    def on_rows(self, rows: pd.DataFrame) -> None:
        for tag, value, step in _scalars(rows):
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def on_end(self, summary: Mapping[str, object], run_dir: Path) -> None:
        self.writer.close()


class MLflowSettings(CallbackConfig):
    tracking_uri: str | None = Field(
        None, description="MLflow's tracking URI (a folder, file://, http(s)://, a database); default "
        "MLFLOW_TRACKING_URI if set, else the folder ./mlruns (an MLflow file store, set up by raysoft)")
    experiment: str = Field("raysoft", description="the MLflow experiment")


DEFAULT_MLRUNS = "mlruns"
"""The MLflow logger's folder when neither ``tracking_uri`` nor ``MLFLOW_TRACKING_URI`` names a
store: ``./mlruns`` of the working directory, where ``mlflow ui --backend-store-uri ./mlruns``
finds it. MLflow 3's own default, ``sqlite:///mlflow.db``, needs SQLAlchemy, which
mlflow-skinny (the ``raysoft[mlflow]`` extra) does not install."""


def is_file_store(uri: str) -> bool:
    """A tracking URI that names a local folder (a path, or ``file:``)."""
    return "://" not in uri and not uri.startswith(("databricks", "sqlite:", "postgresql", "mysql", "mssql")) \
        or uri.startswith("file:")


@contextmanager
def _file_store_allowed(allowed: bool) -> Iterator[None]:
    """MLflow 3 refuses a folder store unless ``MLFLOW_ALLOW_FILE_STORE`` is true (it is in
    maintenance mode, still fully supported); raysoft's logger allows it for the store it was
    given or chose, while MLflow is called, and leaves the process's environment as it was. A
    user's explicit ``MLFLOW_ALLOW_FILE_STORE`` is respected."""
    key = "MLFLOW_ALLOW_FILE_STORE"
    if not allowed or key in os.environ:
        yield
        return
    os.environ[key] = "true"
    try:
        yield
    finally:
        os.environ.pop(key, None)


class MLflowLogger(Callback):
    """Every metric row as an MLflow metric (key ``scope.metric.e<entity>.d<eval_dist>``), the
    config as parameters and the run directory as an artifact (needs ``pip install
    'raysoft[mlflow]'``). Without a ``tracking_uri`` (or ``MLFLOW_TRACKING_URI``) it logs to the
    folder ``./mlruns`` (:data:`DEFAULT_MLRUNS`), which works with mlflow-skinny as installed."""

    Settings = MLflowSettings
    settings: MLflowSettings

    def __init__(self, settings: MLflowSettings, run: RunInfo) -> None:
        super().__init__(settings, run)
        try:
            import mlflow
        except ImportError:
            raise PluginError("callback 'mlflow': needs MLflow (pip install 'raysoft[mlflow]')") from None
        self.mlflow = mlflow
        uri = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or str(Path(DEFAULT_MLRUNS).absolute())
        if is_file_store(uri) and not uri.startswith("file:"):
            uri = Path(uri).expanduser().absolute().as_uri()
        self.uri = uri
        self.allowed = is_file_store(uri)
        with _file_store_allowed(self.allowed):
            mlflow.set_tracking_uri(uri)
            mlflow.set_experiment(settings.experiment)
            self.active = mlflow.start_run(run_name=run.run_id)
            flat = pd.json_normalize(run.config.to_dict(), sep=".").iloc[0].to_dict()
            mlflow.log_params({k: str(v)[:500] for k, v in flat.items()})

    def on_rows(self, rows: pd.DataFrame) -> None:
        with _file_store_allowed(self.allowed):
            for tag, value, step in _scalars(rows):
                self.mlflow.log_metric(tag.replace("/", "."), value, step=step)

    def on_end(self, summary: Mapping[str, object], run_dir: Path) -> None:
        with _file_store_allowed(self.allowed):
            self.mlflow.log_artifacts(str(run_dir))
            self.mlflow.end_run()


T = TypeVar("T")


class Callbacks:
    """The callbacks of one run, called in the config's order; a callback that raises ends the
    run with one line naming it."""

    def __init__(self, cfg: Config, run_id: str, run_dir: Path) -> None:
        info = RunInfo(run_id, Path(run_dir), cfg)
        self.items: list[tuple[str, CallbackHooks]] = []
        for settings in cfg.callbacks:
            cls = settings.plugin.load()
            self.items.append((settings.name, self._call(settings.name, "__init__", cls, settings, info)))

    @staticmethod
    def _call(name: str, hook: str, fn: Callable[..., T], *args: object) -> T:
        try:
            return fn(*args)
        except PluginError:
            raise
        except Exception as err:  # a user's hook: one line naming it
            raise PluginError(f"callback {name!r} failed in {hook}: {type(err).__name__}: "
                              f"{one_line(err)}") from err

    def __bool__(self) -> bool:
        return bool(self.items)

    def on_rows(self, rows: dict[str, list] | None) -> bool:
        """Give every callback the new rows (columns as lists); True if one asks to stop."""
        if not self.items or not rows or not next(iter(rows.values()), None):
            return False
        frame = pd.DataFrame(rows)
        stop = False
        for name, cb in self.items:
            stop |= bool(self._call(name, "on_rows", cb.on_rows, frame.copy()))
        return stop

    def on_end(self, summary: Mapping[str, object], run_dir: Path) -> None:
        for name, cb in self.items:
            self._call(name, "on_end", cb.on_end, summary, Path(run_dir))
