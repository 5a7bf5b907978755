"""The Python API: ``raysoft.run(config) -> RunResult``.

A run validates its config, its data files and (Ray backend) the placement of its client
actors before anything starts, writes into a hidden ``.<run_id>.partial`` directory next to its
final place, and renames it to ``<output.dir>/<run_id>`` only when every file is written, so a
failed run never leaves a half-written result. What a failure keeps:

* a refusal (:class:`ConfigError`, also one raised once Ray runs): nothing, unless the run has
  a checkpoint;
* a failure or a signal (SIGTERM, SIGINT) while training: nothing, for a run without
  checkpoints; a checkpointed run keeps its directory, resumable;
* a failure after training (writing, renaming, publishing): the results are kept where they
  are, and the error (:class:`~raysoft.errors.RunStopped`) says where.

A run to a URI runs into a local staging folder (``tempfile.mkdtemp``) and publishes it; the
folder is removed on success and on failure, but for a failure to publish (kept, and said).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.fs as pafs

from . import provenance
from .backends import run_backend
from .callbacks import Callbacks
from .config import Config, ConfigError, load_config, load_saved_config, name_problem, parse_config
from .errors import DataFileError, MissingDataError, RunStopped, first_line, one_line
from .interrupts import Interrupted, stop_on_signals
from .plugins import short_name
from .progress import Progress
from .results import write_config, write_run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """Where a run's results are, and its summary."""

    run_dir: Path
    run_id: str
    summary: dict[str, Any]
    location: str = ""  # where the results were published: output.dir's URI, or run_dir

    def __post_init__(self) -> None:
        if not self.location:
            object.__setattr__(self, "location", str(self.run_dir))

    def table(self, name: str) -> pd.DataFrame:
        """One of the run's Parquet tables: ``metrics``, ``weights`` or ``clients`` (a run
        published to a URI: read from there, its local staging copy being removed)."""
        if self.run_dir.is_dir() or not is_uri(self.location):
            return pd.read_parquet(self.run_dir / f"{name}.parquet")
        fs, path = pafs.FileSystem.from_uri(self.location)
        with fs.open_input_file(f"{path.rstrip('/')}/{name}.parquet") as f:
            return pd.read_parquet(f)

    @property
    def metrics(self) -> pd.DataFrame:
        return self.table("metrics")


def _coerce(config: Config | Mapping[str, Any] | str | Path | None) -> Config:
    if isinstance(config, Config):
        return config
    if config is None or isinstance(config, Mapping):
        return parse_config(config)
    return load_config(config)


def _with_overrides(cfg: Config, out: str | Path | None, address: str | None) -> Config:
    """``cfg`` with ``output.dir`` / ``ray.address`` replaced (no other key depends on them, so
    the validated config stays valid)."""
    if out is not None:
        cfg = _replace(cfg, "output", dir=str(out))
    if address is not None:
        cfg = _replace(cfg, "ray", address=address)
    return cfg


def _replace(cfg: Config, section: str, **values: Any) -> Config:
    """A copy of ``cfg`` with some keys of one section replaced, for keys whose values were
    checked by the caller (paths and addresses); the config is not validated again."""
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=values)})


def check_data(cfg: Config) -> Config:
    """Fail before anything starts if the dataset's files are missing or not in their format, or
    the model does not fit the data; pin the resolved data folder into the config so that
    workers on other nodes do not depend on this environment. Imports neither torch nor
    torchvision (the driver of a Ray run then never does)."""
    from .catalog import IMAGE_DATASETS, LEAF_DATASETS, ImageData, LeafData, ScenarioData, data_kind, model_misfit
    from .datafiles import DataFileError, MissingDataError, default_root, verify_files
    from .datafiles.leaf_files import require_leaf

    root = None
    data = cfg.data
    files = data.base if isinstance(data, ScenarioData) else data.name  # a scenario reads its base's files
    if isinstance(data, (ImageData, ScenarioData)) and files in IMAGE_DATASETS:
        try:
            if getattr(data, "download", False):  # torchvision (and torch) are imported only if files are missing
                from .datafiles.download import ensure_files

                root = ensure_files(files, data.root)
            else:
                root = default_root(files, data.root)
            verify_files(files, root)
        except (MissingDataError, DataFileError) as err:
            raise ConfigError(f"data: {err}") from None
    if isinstance(data, LeafData) and data.name in LEAF_DATASETS:
        try:
            root = require_leaf(data.name, data.root)
        except MissingDataError as err:
            raise ConfigError(f"data: {err}") from None
    plugin_base = isinstance(data, ScenarioData) and data.base not in IMAGE_DATASETS  # its shape: when built
    if cfg.model.plugin.builtin and cfg.data.plugin.builtin and not plugin_base:
        why = model_misfit(cfg.model.name, *data_kind(cfg.data.name, getattr(data, "base", None)))
        if why is not None:
            raise ConfigError(f"model.name: {why}")
    # a plug-in's code (not a built-in's, which would import torch here) is imported and checked now,
    # before anything starts; a dataset plug-in's own check of its files runs too
    for plugin in cfg.plugins:
        if not plugin.builtin:
            plugin.load()
    if not cfg.algorithm.plugin.builtin:  # its client ops (set on the object) are known now
        from .algorithms import make_algorithm

        make_algorithm(cfg.algorithm)
    verify = None if cfg.data.plugin.builtin else getattr(cfg.data.plugin.load(), "verify", None)
    if verify is not None:
        try:
            verify(cfg.data)
        except (OSError, ValueError) as err:
            raise ConfigError(f"data: {cfg.data.name}: {one_line(err)}") from None
    if root is not None and getattr(cfg.data, "root", None) != root:
        cfg = _replace(cfg, "data", root=str(root))
    return cfg


def in_ray_job() -> bool:
    """This process is the entrypoint of a Ray Job (its working directory is temporary)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def job_output_dir(out_dir: str, address: str) -> str:
    """Where a run submitted as a Ray Job to the Jobs API at ``address`` writes: a URI or an
    absolute path as given; a relative path is made absolute here when the cluster runs on this
    machine (a loopback address: its nodes see this machine's files), and refused otherwise
    (:func:`check_output_survives`)."""
    from urllib.parse import urlparse

    if not is_uri(out_dir) and not Path(out_dir).is_absolute() and urlparse(address).hostname in LOOPBACK:
        return str(Path(out_dir).absolute())
    check_output_survives(out_dir, job=True)
    return out_dir


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check_output_survives(out_dir: str, job: bool) -> None:
    """A run submitted as a Ray Job writes from the job's unpacked working directory, which Ray
    deletes: a relative ``output.dir`` would lose the results, so it is refused."""
    if job and not is_uri(out_dir) and not Path(out_dir).is_absolute():
        raise ConfigError(f"output.dir: {out_dir!r} is relative, and a Ray Job's working directory is temporary; "
                          "give an absolute path on storage the cluster's nodes share (--out /shared/runs) "
                          "or a pyarrow.fs URI (--out s3://bucket/runs)")


def _prepare_out(path: str) -> Path:
    out = Path(path).absolute()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"output.dir: cannot create {path!r} ({err.strerror})") from None
    if not os.access(out, os.W_OK):
        raise ConfigError(f"output.dir: {path!r} is not writable")
    return out


def new_run_id(cfg: Config) -> str:
    prefix = cfg.output.name or f"{short_name(cfg.algorithm.name)}-{short_name(cfg.data.name)}"
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def check_resources(cfg: Config) -> None:
    """Refuse (Ray backend) a plan of client actors the cluster can never hold, before anything
    is written: before Ray starts for a local Ray raysoft starts (see
    :func:`raysoft.backends.cluster.preflight`)."""
    if cfg.ray.backend == "ray":
        from .backends.cluster import preflight

        preflight(cfg)


def run(
    config: Config | Mapping[str, Any] | str | Path | None = None,
    *,
    out: str | Path | None = None,
    address: str | None = None,
    progress: str | None = None,
    dir_name: str | None = None,
) -> RunResult:
    """Run one experiment and return where its results are.

    ``config`` is a :class:`Config`, a mapping of sections, or a YAML path. ``out`` and
    ``address`` override ``output.dir`` and ``ray.address``; ``dir_name`` names the run
    directory (default: the run id).
    """
    cfg = check_data(_with_overrides(_coerce(config), out, address))
    check_output_survives(cfg.output.dir, in_ray_job())
    why = name_problem(dir_name) if dir_name is not None else None
    if why is not None:
        raise ConfigError(f"dir_name: {why}")
    check_resources(cfg)
    uri = cfg.output.dir if is_uri(cfg.output.dir) else None
    if uri is None:
        result = _run_local(cfg, progress, dir_name)
        log.info("results in %s", result.run_dir)
        return result
    # run into a local staging folder, then publish with pyarrow.fs; the folder is removed
    # afterwards, unless an error says the results are kept in it (RunStopped)
    fs, base = _filesystem(uri)
    if cfg.output.checkpoint_every:
        raise ConfigError("output.checkpoint_every: checkpoints need a local output.dir (not a URI)")
    staging = tempfile.mkdtemp(prefix="raysoft-")
    try:
        with stop_on_signals():
            result = _run_local(_replace(cfg, "output", dir=staging), progress, dir_name)
            final, run_id, summary = result.run_dir, result.run_id, result.summary
            target = f"{base.rstrip('/')}/{final.name}"
            location = f"{uri.rstrip('/')}/{final.name}"
            try:  # one writer: this driver publishes the finished run
                fs.create_dir(target, recursive=True)
                pafs.copy_files(str(final), target, destination_filesystem=fs)
            except BaseException as err:  # pyarrow raises several types, or a signal: one line
                why = f"stopped by {signal.Signals(err.signum).name}" if isinstance(err, Interrupted) else one_line(err)
                raise RunStopped(f"the run finished but publishing it to {location} failed ({why}); "
                                 f"its complete results are kept in {final}") from err
    except RunStopped:  # it says the results are kept in the staging folder
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    log.info("results in %s", location)
    return RunResult(run_dir=final, run_id=run_id, summary=summary, location=location)


def _run_local(cfg: Config, progress: str | None, dir_name: str | None) -> RunResult:
    """:func:`run` into the local folder ``output.dir``."""
    out_dir = _prepare_out(cfg.output.dir)
    run_id = new_run_id(cfg)
    final = out_dir / (dir_name or run_id)
    if final.exists():
        raise ConfigError(f"output.dir: {str(final)!r} already exists")
    # a checkpointed run writes in place (a killed run can be resumed and read up to its last
    # checkpoint); otherwise the run appears only when complete
    checkpointed = cfg.output.checkpoint_every > 0
    work = final if checkpointed else out_dir / f".{final.name}.partial"
    work.mkdir()
    with stop_on_signals():
        try:
            write_config(work, cfg.to_dict())
            provenance.write(work, cfg)  # (it may import torch: seconds in which a signal may come)
        except KeyboardInterrupt as err:  # a signal before training: nothing to keep
            shutil.rmtree(work, ignore_errors=True)
            signum = getattr(err, "signum", signal.SIGINT)
            if not checkpointed:  # as a signal during training says it
                raise _stopped(signum, work, keep=False) from None
            raise Interrupted(signum, f"run stopped by {signal.Signals(signum).name} before its first round; its "
                              f"directory {work} was removed (nothing to resume)") from None
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        tables, summary, callbacks = _train(cfg, run_id, work, progress, resume=False, fresh=True)
        _finish(cfg, work, final, tables, summary)
        _end_callbacks(callbacks, summary, final)
    return RunResult(run_dir=final, run_id=run_id, summary=summary)


def _stopped(signum: int, work: Path, keep: bool) -> Interrupted:
    """The one line of a run a signal stopped: where its directory was kept and how to continue
    it (``keep``), or that its partial results were removed."""
    name = signal.Signals(signum).name
    if keep:
        return Interrupted(signum, f"run stopped by {name}; {_kept(work)}")
    return Interrupted(signum, f"run stopped by {name}; its partial results were removed (a run without "
                       "checkpoints cannot be resumed: output.checkpoint_every makes it resumable)")


def _kept(work: Path) -> str:
    """Where a checkpointed run's directory is and how to continue it."""
    if (work / "checkpoint.pt").is_file():
        return f"kept in {work} up to its last checkpoint; continue with: raysoft run --resume {work}"
    return f"kept in {work} (no checkpoint yet: resuming starts it again); continue with: raysoft run --resume {work}"


def _train(cfg: Config, run_id: str, work: Path, progress: str | None, resume: bool,
           fresh: bool) -> tuple[dict[str, Any], dict[str, Any], Callbacks]:
    """Run the backend into ``work`` (``fresh``: created by this call); on failure remove
    ``work`` unless it is resumable (a checkpointed run, or a resumed one) and say which."""
    keep = not fresh or cfg.output.checkpoint_every > 0

    def discard(refused: bool) -> None:
        # a refusal of a fresh run discards its directory unless a checkpoint was written
        if fresh and (not keep or (refused and not (work / "checkpoint.pt").exists())):
            shutil.rmtree(work, ignore_errors=True)

    bar = Progress(cfg.algorithm.rounds, progress or cfg.output.progress, label=cfg.algorithm.name)
    try:
        callbacks = Callbacks(cfg, run_id, work)

        def on_progress(info: dict[str, Any]) -> bool:
            bar(info)
            return callbacks.on_rows(info.get("rows"))

        tables, summary = run_backend(cfg, run_id, on_progress, run_dir=str(work), resume=resume)
        return tables, summary, callbacks
    except KeyboardInterrupt as err:
        discard(refused=False)
        raise _stopped(getattr(err, "signum", signal.SIGINT), work, keep) from None
    except (MissingDataError, DataFileError) as err:  # found by a loader (in an actor, on another node)
        discard(refused=True)
        raise ConfigError(f"data: {err}") from None
    except ConfigError:
        discard(refused=True)
        raise
    except BaseException as err:
        discard(refused=False)
        if keep:
            err.add_note(f"The run directory is {_kept(work)}.")
        raise
    finally:
        bar.close()  # before the stop message is written: never drawn again below it


def _end_callbacks(callbacks: Callbacks, summary: dict[str, Any], run_dir: Path) -> None:
    """The callbacks' ``on_end``, once the run is written; a failure there keeps the results."""
    if callbacks:
        try:
            callbacks.on_end(summary, run_dir)
        except ConfigError as err:
            raise RunStopped(f"{err}; the run's results are complete in {run_dir}") from err


def _finish(cfg: Config, work: Path, final: Path, tables: dict[str, Any], summary: dict[str, Any]) -> None:
    """Write the finished run into ``work`` and move it to ``final``; a failure (or a signal)
    keeps whatever is in ``work`` and says where (:class:`RunStopped`)."""
    try:
        write_run(work, cfg.to_dict(), tables, summary)
    except BaseException as err:
        how = ("continue with: raysoft run --resume " + str(work) if (work / "checkpoint.pt").is_file()
               else "a run without checkpoints cannot be resumed")
        why = f"stopped by {signal.Signals(err.signum).name}" if isinstance(err, Interrupted) else one_line(err)
        raise RunStopped(f"the run finished but writing its results failed ({why}); what was written is kept in "
                         f"{work} ({how})") from err
    if work == final:
        return
    try:
        os.replace(work, final)
    except BaseException as err:
        why = f"stopped by {signal.Signals(err.signum).name}" if isinstance(err, Interrupted) else one_line(err)
        raise RunStopped(f"the run finished but could not be moved to {final} ({why}); its complete results are "
                         f"kept in {work}") from err


def is_uri(path: str) -> bool:
    """``output.dir`` names remote storage (``s3://``, ``gs://``, ``file://``, ...)."""
    return "://" in str(path)


def _filesystem(uri: str):
    """(pyarrow filesystem, path inside it) of an output URI; ConfigError if pyarrow cannot use it."""
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
        fs.create_dir(path, recursive=True)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types; report them as one line
        raise ConfigError(f"output.dir: cannot use {uri!r} ({first_line(err)})") from None
    return fs, path


def resumed_from(blob: Mapping[str, Any], cfg: Config) -> str:
    """Where a run continues from its checkpoint ``blob``: ``from round 162 of 400 (its last
    checkpoint)`` (``upload`` for a stream), the step of the checkpoint's own event."""
    events = blob["recorder"].get("events", {})
    steps = [step for step, kind in zip(events.get("step", []), events.get("kind", [])) if kind == "checkpoint"]
    unit = "upload" if getattr(type(cfg.algorithm), "stream", False) else "round"
    if not steps:
        return "from its last checkpoint"
    return f"from {unit} {int(steps[-1])} of {cfg.algorithm.rounds} (its last checkpoint)"


def resume(run_dir: str | Path, *, address: str | None = None, progress: str | None = None) -> RunResult:
    """Continue a run from the last checkpoint in ``run_dir`` (from the start if it has none).
    The finished run's metrics equal those of an uninterrupted run with the same seed. The
    checkpoint is loaded as data only (see :mod:`raysoft.runtime.checkpoint`): a file that
    would run code is refused."""
    d = Path(run_dir).expanduser().absolute()  # printed and returned absolute, as for a fresh run
    if not (d / "config.yaml").is_file():
        raise ConfigError(f"--resume: {str(d)!r} is not a run directory (no config.yaml)")
    if (d / "summary.json").is_file():
        raise ConfigError(f"--resume: {str(d)!r} is already complete")
    cfg = check_data(_with_overrides(load_saved_config(d / "config.yaml"), None, address))
    check_resources(cfg)
    run_id = d.name
    where = "from the start (no checkpoint was written)"
    if (d / "checkpoint.pt").is_file():
        from .runtime.checkpoint import load_checkpoint

        blob = load_checkpoint(d)
        assert blob is not None
        run_id = blob["recorder"]["metrics"]["run_id"][0]
        where = resumed_from(blob, cfg)
    other = provenance.on_resume(d, cfg)
    if other:
        sys.stderr.write(f"{cfg.algorithm.name}: {other}\n")
    if (progress or cfg.output.progress) != "none":
        sys.stderr.write(f"{cfg.algorithm.name}: resuming {d} {where}\n")
        sys.stderr.flush()
    log.info("resuming %s %s", d, where)
    with stop_on_signals():
        tables, summary, callbacks = _train(cfg, run_id, d, progress, resume=True, fresh=False)
        _finish(cfg, d, d, tables, summary)
        _end_callbacks(callbacks, summary, d)
    return RunResult(run_dir=d, run_id=run_id, summary=summary)
