"""Checkpoints: everything a coordinator needs to continue a run, written atomically, and read
back as data only.

A checkpoint is written with ``torch.save`` and read with ``torch.load(weights_only=True)``:
the unpickler builds tensors, containers, numbers and strings, and instances of the types
listed in :func:`checkpoint_types` (raysoft's own state classes, torch's layers, the
optimizers, numpy arrays, and the classes of the plug-ins this process has loaded: those their
modules define and their ``state_types``), and calls nothing else. A file that asks for anything more (a
checkpoint someone else wrote to run code on ``--resume``) is refused with a one-line
:class:`~raysoft.config.ConfigError` naming the file and what it asked for; nothing in it runs.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError
from ..errors import one_line
from ..results import Recorder, atomic_path, write_tables

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(run_dir: Path, blob: dict[str, Any], recorder: Recorder) -> None:
    """Write the results so far, then the checkpoint atomically (temporary file, then rename):
    whenever a checkpoint of round r is on disk, the tables beside it hold at least round r's
    rows, even if the process is killed between the two writes."""
    write_tables(run_dir, recorder.tables())
    with atomic_path(run_dir / CHECKPOINT) as tmp:
        torch.save(blob, tmp)


# types that modules above this one add (recording.py: Served, Clusterings), so that this module
# imports none of them (no import cycle)
RECORD_TYPES: list[type] = []


def checkpoint_types() -> list[Any]:
    """Every type a checkpoint of raysoft's algorithms holds beyond what ``weights_only``
    loads by default (the tests run every algorithm with a checkpoint each round and load it
    back with these alone)."""
    import numpy as np
    from torch import nn

    from .. import catalog, models, optim
    from ..algorithms import ccfl, fedavg, fedem, fedsoft, fpfc, ifca, settings, stream
    from ..config import DataConfig
    from ..data.drift import DriftingImages
    from ..plugins import state_types

    core = getattr(np, "_core", None) or np.core
    layers = [c for c in vars(nn).values() if isinstance(c, type) and issubclass(c, nn.Module)]
    return [*state_types(), *layers,
        # client and server states
        fedsoft.FedSoftState, fedsoft.FedSoftClient, ifca.IFCAState, fedem.FedEMState, fedem.FedEMClient,
        fedavg.GlobalModel, fedavg.LocalClient, fpfc.FPFCState, ccfl.CCFLServerState, stream.StreamClient,
        DriftingImages, DataConfig, models.DataInfo, *catalog.DATASETS, *catalog.MODELS,
        *RECORD_TYPES,  # the coordinator's records of the clients served and the clusterings
        *(c for c in vars(settings).values() if isinstance(c, type) and issubclass(c, settings.AlgorithmConfig)),
        # optimizers and the models a client keeps (and their layers)
        optim.Adam, optim.SGD,
        models.LinearRegression, models.Logistic, models.ConvNet, models.CifarCNN, models.MaxPool2x2,
        models.CharLSTM,
        nn.Linear, nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Sequential, nn.GroupNorm, nn.Identity,
        nn.AdaptiveAvgPool2d,
        # numpy arrays and scalars
        core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype, bytes,
        *{type(np.dtype(t)) for t in ("f4", "f8", "i4", "i8", "u1", "?")},
    ]


def prove_loadable(run_dir: Path, algorithm: str) -> None:
    """Load the checkpoint just written in ``run_dir`` back as ``--resume`` will; if it holds a
    class a checkpoint may not hold (a plug-in's state class defined in another module, not in
    its ``state_types``), remove it and raise a one-line :class:`ConfigError` naming the class
    and the fix, so that a run whose checkpoints could never be resumed stops at its first."""
    path = run_dir / CHECKPOINT
    try:
        with torch.serialization.safe_globals(checkpoint_types()):
            torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        path.unlink(missing_ok=True)
        asked = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = asked.group(1) if asked else "an object of a class that is not allowed"
        short = what.rsplit(".", 1)[-1] if asked else "TheClass"
        raise ConfigError(
            f"output.checkpoint_every: algorithm {algorithm!r}'s checkpoint holds {what}, which --resume would "
            f"refuse, so the run stopped at its first checkpoint; list the class in the algorithm's state_types "
            f"(state_types = ({short},)) or define it in the plug-in's own module") from None


def load_checkpoint(run_dir: Path | None) -> dict[str, Any] | None:
    """The checkpoint in ``run_dir``, or None if there is none; :class:`ConfigError` (one line,
    naming the file) if it is not a raysoft checkpoint or cannot be read."""
    path = run_dir / CHECKPOINT if run_dir else None
    if path is None or not path.exists():
        return None
    try:
        with torch.serialization.safe_globals(checkpoint_types()):
            blob = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        text = str(err)
        asked = re.search(r"GLOBAL ([\w.]+)", text)
        if asked:
            why = f"it asks for {asked.group(1)}, which a checkpoint never holds"
        else:  # torch's message: the unpickler's own reason after "WeightsUnpickler error:"
            reason = text.split("WeightsUnpickler error:", 1)[-1].strip().split("\n\n")[0]
            why = one_line(reason) or "unreadable"
        raise ConfigError(f"{path}: not a raysoft checkpoint ({why}); refused, nothing in it was run") from None
    except (RuntimeError, EOFError, OSError, ValueError, TypeError, AttributeError, KeyError) as err:
        lines = str(err).strip().splitlines()
        raise ConfigError(f"{path}: cannot read the checkpoint ({type(err).__name__}: "
                          f"{one_line(lines[0] if lines else '')})") from None
    if not isinstance(blob, dict) or "recorder" not in blob:
        raise ConfigError(f"{path}: not a raysoft checkpoint (no recorded results in it)")
    return blob
